-- sekali schema, version 10 (PRAGMA user_version = 10).
--
-- Applied at startup, idempotently, by src/store/sqlite/schema.rs, which embeds this file in the
-- binary.
-- Table and column names are part of sekali's interface: operators query them with sqlite3.
-- Every timestamp is ISO-8601 UTC text, YYYY-MM-DDTHH:MM:SSZ: fixed width, so it sorts as text.
-- Amounts are integers in minor units of their currency: Stripe's amount as sent (Stripe's own
-- exponents: JPY 5000 is 5,000 yen), Midtrans "10000.00" -> 1000000 and Xendit 150000 (main
-- units) -> 15000000 (ISO 4217: IDR has two).
-- CHECKs over more than two values are OR chains, not IN lists: for an IN list of three or more
-- constants SQLite builds a temporary B-tree on every row it checks, which cost a fifth of the
-- writer's time (version 1 had IN lists; src/store/sqlite/schema.rs rewrites them in place).

-- One row per (provider, event id) ever claimed and not yet purged: the deduplication record.
-- A row exists if and only if the event's effects were committed in the same transaction.
CREATE TABLE IF NOT EXISTS processed_events (
    -- The provider's name (stripe, midtrans, xendit): any the registry knows, so not listed in
    -- a CHECK (versions before 5 listed stripe and midtrans).
    provider          TEXT NOT NULL,
    -- Stripe's evt_... id; the derived Midtrans id
    -- order_id:transaction_status:status_code[:fraud_status][:refund identity | :transaction_id],
    -- each part with '\' and ':' escaped as '\\' and '\:' (see src/providers/midtrans.rs);
    -- Xendit's webhook-id header, else {invoice id}:{STATUS} (see src/providers/xendit.rs).
    event_id          TEXT NOT NULL,
    -- Stripe's event type; Midtrans' transaction_status; for Xendit, invoice. and the status in
    -- lower case (invoice.paid).
    event_type        TEXT NOT NULL,
    -- The order the event names or was found through its payment, ignored events included. NULL
    -- when it names none, or while its payment is linked to no order (parked events).
    order_id          TEXT,
    -- What the event did (src/domain/decision.rs):
    -- processed: its facts changed what the ledger knew (a payment, a refund, a dispute);
    -- stale: its facts were known already; nothing changed;
    -- ignored: an event type sekali does not act on, or one that names no payment;
    -- parked: its facts are about a payment no order is linked to yet (a Stripe charge or
    --         dispute before the event naming its order); they wait on the payment (payments,
    --         order_id NULL) and count once an event names the payment and its order, when the
    --         outcome becomes processed;
    -- amount_mismatch: a payment that does not match its order (an API order's amount,
    --         currency or provider; a Xendit invoice paid short or over); needs_review;
    -- reversed: the provider took back a payment it had settled (a Midtrans deny or cancel of
    --         that transaction after its settlement); needs_review;
    -- needs_review: its facts put the order in review for another reason (orders.review_reason).
    -- needs_review was added in version 7.
    outcome           TEXT NOT NULL CHECK (outcome = 'processed' OR outcome = 'stale'
                          OR outcome = 'ignored' OR outcome = 'parked'
                          OR outcome = 'amount_mismatch' OR outcome = 'reversed'
                          OR outcome = 'needs_review'),
    received_at       TEXT NOT NULL,
    -- received_at plus the provider's retention; the purge deletes rows past it (never parked
    -- rows), and a redelivery after it is treated as a new event.
    expires_at        TEXT NOT NULL,
    -- The payment the event is about (payments.payment_ref), if any: a Stripe PaymentIntent
    -- (pi_...), a Charges API charge (ch_...), a subscription's invoice (in_...); a Midtrans
    -- transaction_id; a Xendit invoice id.
    payment_intent_id TEXT,
    -- The raw request body exactly as received and verified.
    payload           TEXT NOT NULL,
    -- Unused since version 7 (a parked event's facts wait on its payment); versions 5 and 6 kept
    -- a parked event here in its normalised form.
    parked_event      TEXT,
    -- The request headers the delivery came with that are no secret and no signature (a JSON
    -- object of the names in src/routes/webhooks.rs KEPT_HEADERS, such as content-type and
    -- user-agent), for an operator to look at. NULL for events stored before version 9.
    headers           TEXT,
    PRIMARY KEY (provider, event_id)
);

-- Indexes cost every delivery a B-tree insert, so only those the service itself needs exist:
-- the purge's (expires_at), the parked lookup (the events whose outcome a payment's link
-- turns to processed), and an order's events newest first (the console's order page,
-- `sekali events list --order`), which would otherwise read the whole table for an old order
-- (version 10; the index holds the rowid behind the order id). Listing uses rowid, which is
-- arrival order.
CREATE INDEX IF NOT EXISTS processed_events_expires_at ON processed_events (expires_at);
CREATE INDEX IF NOT EXISTS processed_events_parked
    ON processed_events (payment_intent_id) WHERE outcome = 'parked';
CREATE INDEX IF NOT EXISTS processed_events_order
    ON processed_events (order_id) WHERE order_id IS NOT NULL;

-- The shop's orders, created through the API (POST /orders) or first seen in a webhook, and
-- moved by the webhooks. Never purged.
CREATE TABLE IF NOT EXISTS orders (
    order_id          TEXT PRIMARY KEY NOT NULL,
    provider          TEXT NOT NULL,
    -- Computed from its payments (src/domain/ledger.rs): with money taken, paid,
    -- partially_refunded or refunded by the money given back, disputed while a dispute holds
    -- money; without, pending, failed, expired or cancelled by how its payments' attempts ended;
    -- needs_review with a review_reason; or what an operator set (operator_status), until
    -- money moves.
    status            TEXT NOT NULL CHECK (status = 'pending' OR status = 'paid'
                          OR status = 'failed' OR status = 'cancelled' OR status = 'expired'
                          OR status = 'partially_refunded' OR status = 'refunded'
                          OR status = 'disputed' OR status = 'needs_review'),
    amount            INTEGER,
    refunded_amount   INTEGER NOT NULL DEFAULT 0,
    currency          TEXT,
    customer_email    TEXT,
    -- The payment that took the order's money, else the first one linked to it (all of them:
    -- payments.order_id).
    payment_intent_id TEXT,
    created_at        TEXT NOT NULL,
    updated_at        TEXT NOT NULL,
    -- The event that last changed the order ('api:<client>' for creation through the API,
    -- 'operator' for sekali orders set-status).
    last_event_id     TEXT NOT NULL,
    -- 'api': created by POST /orders (webhooks must then match its amount and currency);
    -- 'webhook': first seen in a webhook.
    source            TEXT NOT NULL DEFAULT 'webhook' CHECK (source IN ('webhook', 'api')),
    -- The JSON object given at creation through the API, if any.
    metadata          TEXT,
    -- What its payments took, in the order's units, and in which currency: what the receipt
    -- shows. NULL before a payment, and for orders paid before version 4. Added in version 4.
    -- refunded_amount above is the money given back, in the order's units too.
    paid_amount       INTEGER,
    paid_currency     TEXT,
    -- Decimals of the order's amounts in its provider's minor units (Stripe's own table, else
    -- ISO 4217: JPY 0, IDR 2, BHD 3). NULL for orders written before version 5 (their emails
    -- then use ISO 4217). Added in version 5.
    amount_exponent   INTEGER,
    -- The payer's address as the provider last reported it. customer_email is where the
    -- customer's emails go: the shop's own address for an order created through the API with
    -- one (a webhook never overwrites it), else the payer's. Added in version 6 (orders first
    -- seen in a webhook before it got their customer_email here).
    payer_email       TEXT,
    -- Why the order needs a look (status needs_review): two payments took money, money taken
    -- after a cancel, a payment that does not match the order, a reversal, more given back than
    -- taken, a refund the customer was told of that failed. NULL otherwise. Added in version 7.
    review_reason     TEXT,
    -- An operator's decision (sekali orders set-status): the status, and the money the order
    -- showed then (JSON: captured, returned, withdrawn, ISO 4217 minor units); it stands until
    -- money moves. NULL otherwise. Added in version 7.
    operator_status   TEXT,
    operator_money    TEXT,
    -- Review reasons an operator has decided on (a JSON array of their texts): they no longer
    -- count. Added in version 7.
    acknowledged      TEXT,
    -- Money given back that the customer was told of by refund notices (ISO 4217 minor units of
    -- the payments' currency). Added in version 7.
    announced_returned INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;


-- Every status change of every order, in the transaction that made it: the audit trail.
-- from_status is NULL when the event created the order. One row per change, so
-- `email_outbox` holds exactly one row per change to a status that has a notice.
CREATE TABLE IF NOT EXISTS order_transitions (
    id                INTEGER PRIMARY KEY,
    order_id          TEXT NOT NULL REFERENCES orders (order_id),
    from_status       TEXT,
    to_status         TEXT NOT NULL,
    -- The order's cumulative refunded amount after the change.
    refunded_amount   INTEGER NOT NULL,
    -- Who made the change: a provider's name with its event id; 'api' with 'api:<client>'
    -- (creation through the orders API); 'operator' with 'operator' (sekali orders set-status).
    provider          TEXT NOT NULL,
    event_id          TEXT NOT NULL,
    changed_at        TEXT NOT NULL,
    -- For an operator's change, the operator's name (--by, else the OS user); for the API's,
    -- the client's name. NULL for a provider's event. Added in version 6.
    actor             TEXT,
    -- Why an operator made the change (--reason, required). NULL otherwise. Added in version 6.
    reason            TEXT,
    -- The order's change number: 1 for the change that created it, then 2, 3, ... (the change
    -- feed's and forwarding's `sequence`). Set on every row, also those written before version 8.
    sequence          INTEGER,
    -- The order's amount and currency at the change (what the change feed and forwarding send).
    -- Added in version 8; earlier rows got the order's as the migration found it.
    amount            INTEGER,
    currency          TEXT
);

-- An order's history (GET /orders/{id}) reads its transitions in order. Added in version 6.
CREATE INDEX IF NOT EXISTS order_transitions_order ON order_transitions (order_id, id);


-- The ledger (src/domain/ledger.rs): every payment sekali has heard of, one row per
-- (provider, payment_ref), holding what every event said of it, merged so that the order of
-- delivery cannot matter. An order's status is computed from its payments. Amounts are in ISO
-- 4217 minor units of the payment's currency (Stripe's ISK 50000 is ISK 500 here); times are
-- the events' own (when the provider says), NULL when unknown. Never purged. Added in version 7.
CREATE TABLE IF NOT EXISTS payments (
    provider          TEXT NOT NULL,
    -- A Stripe PaymentIntent (pi_...), a Charges API charge (ch_...) or a subscription's first
    -- invoice (in_...); a Midtrans transaction_id ('order:' and the order id for a notification
    -- that named none); a Xendit invoice id.
    payment_ref       TEXT NOT NULL,
    -- The order it pays; NULL until an event names both (its events are then 'parked').
    order_id          TEXT,
    currency          TEXT,
    -- What it asked for; what it must take to be paid in full when that differs (a Xendit
    -- invoice's amount); what it held on the card without taking it.
    requested         INTEGER,
    expected          INTEGER,
    authorized        INTEGER,
    -- Money taken from the customer, cumulative, and when first taken.
    captured          INTEGER NOT NULL DEFAULT 0,
    captured_at       TEXT,
    -- An authorisation given back without being taken (a cancelled uncaptured payment, a
    -- partial capture's remainder); and the part of the refunds that was such a release (Stripe
    -- before API version 2025-03-31.basil made a Refund of it). Neither is money returned.
    released          INTEGER NOT NULL DEFAULT 0,
    released_as_refunds INTEGER NOT NULL DEFAULT 0,
    -- How far it got without taking money (pending, failed, expired, canceled), and when.
    attempt           TEXT NOT NULL DEFAULT 'pending'
                          CHECK (attempt = 'pending' OR attempt = 'failed'
                                 OR attempt = 'expired' OR attempt = 'canceled'),
    attempt_at        TEXT,
    -- 1 when the provider said it did not stand (a Midtrans deny or cancel): with money taken,
    -- a reversal.
    undone            INTEGER NOT NULL DEFAULT 0,
    -- A charge's cumulative refunded amount as last reported, and when (Stripe), for refunds
    -- whose ids no event listed.
    refunded_reported INTEGER,
    refunded_reported_at TEXT,
    -- Computed from the above and its refunds and disputes, for readers: money given back,
    -- and money disputes or a reversal took back.
    returned          INTEGER NOT NULL DEFAULT 0,
    withdrawn         INTEGER NOT NULL DEFAULT 0,
    -- How many rows it has in payment_refunds and payment_disputes.
    refund_count      INTEGER NOT NULL DEFAULT 0,
    dispute_count     INTEGER NOT NULL DEFAULT 0,
    created_at        TEXT NOT NULL,
    updated_at        TEXT NOT NULL,
    PRIMARY KEY (provider, payment_ref)
) WITHOUT ROWID;

-- An order's payments, read to compute it.
CREATE INDEX IF NOT EXISTS payments_order ON payments (order_id) WHERE order_id IS NOT NULL;

-- Each refund of a payment by its id, in its furthest state: pending < succeeded < failed (a
-- refund can fail after it was reported succeeded). failed_at: when the failure was reported.
CREATE TABLE IF NOT EXISTS payment_refunds (
    provider          TEXT NOT NULL,
    payment_ref       TEXT NOT NULL,
    refund_id         TEXT NOT NULL,
    amount            INTEGER NOT NULL,
    state             TEXT NOT NULL CHECK (state = 'pending' OR state = 'succeeded'
                                           OR state = 'failed'),
    failed_at         TEXT,
    PRIMARY KEY (provider, payment_ref, refund_id)
) WITHOUT ROWID;

-- Each dispute of a payment by its id, in its furthest stage: inquiry < inquiry_closed < open
-- < won | lost; withdrawn and reinstated say the provider reported the funds taken and given
-- back. A Midtrans chargeback is a dispute lost, its funds withdrawn.
CREATE TABLE IF NOT EXISTS payment_disputes (
    provider          TEXT NOT NULL,
    payment_ref       TEXT NOT NULL,
    dispute_id        TEXT NOT NULL,
    amount            INTEGER NOT NULL,
    stage             TEXT NOT NULL CHECK (stage = 'inquiry' OR stage = 'inquiry_closed'
                                           OR stage = 'open' OR stage = 'won' OR stage = 'lost'),
    withdrawn         INTEGER NOT NULL,
    reinstated        INTEGER NOT NULL,
    PRIMARY KEY (provider, payment_ref, dispute_id)
) WITHOUT ROWID;

-- Work a migration left for a sekali that can do it: 'ledger', the ledger's rebuild from the
-- stored events, which needs each provider to read its bodies again (src/store/sqlite/rebuild.rs;
-- done when serve first opens the database; the other commands leave it). Added in version 7.
CREATE TABLE IF NOT EXISTS pending_work (
    name              TEXT PRIMARY KEY NOT NULL
) WITHOUT ROWID;

-- Other references that name a payment (a Stripe invoice's PaymentIntent and charge): facts
-- that arrive under one are the payment's.
CREATE TABLE IF NOT EXISTS payment_aliases (
    provider          TEXT NOT NULL,
    alias             TEXT NOT NULL,
    payment_ref       TEXT NOT NULL,
    PRIMARY KEY (provider, alias)
) WITHOUT ROWID;

-- Customer emails to send, written in the same transaction as the status change they announce.
-- Never purged.
CREATE TABLE IF NOT EXISTS email_outbox (
    id                INTEGER PRIMARY KEY,
    order_id          TEXT NOT NULL REFERENCES orders (order_id),
    -- NULL when no event carried an address.
    recipient         TEXT,
    template          TEXT NOT NULL CHECK (template = 'receipt' OR template = 'payment_failed'
                          OR template = 'refund_notice'),
    -- JSON object: order_id, status, amount (for a receipt what was paid), currency, exponent (its
    -- decimals), refund_amount (a refund notice's money given back this time; since version 7),
    -- refunded_amount (in all), refunded_currency, provider, event_id.
    params            TEXT NOT NULL,
    -- For the downstream sender (Message-ID, Idempotency-Key header): hex SHA-256 of the
    -- order id, template, status and refunded amount, so one status change yields one key,
    -- whichever event announced it. Unique (email_outbox_order_key below).
    idempotency_key   TEXT NOT NULL,
    -- pending: waiting to be sent (again); sent: the transport confirmed it; dead: a permanent
    -- failure or the attempt limit (see last_error; `sekali outbox retry` revives it);
    -- skipped: no recipient.
    status            TEXT NOT NULL DEFAULT 'pending'
                          CHECK (status = 'pending' OR status = 'sent' OR status = 'dead'
                                 OR status = 'skipped'),
    -- Transport tries so far (a relay's lease running out is not a try).
    attempts          INTEGER NOT NULL DEFAULT 0,
    created_at        TEXT NOT NULL,
    -- The event that caused this email.
    event_id          TEXT NOT NULL,
    -- The relay's timing columns use fixed-width millisecond UTC (YYYY-MM-DDTHH:MM:SS.mmmZ) so
    -- they sort as text. next_attempt_at: when a pending row is due; NULL once sent, dead or
    -- skipped.
    next_attempt_at   TEXT,
    -- The relay holding the row and until when; a row whose lease ran out is claimed again.
    lease_owner       TEXT,
    lease_until       TEXT,
    last_error        TEXT,
    sent_at           TEXT,
    -- When the first try that may have reached the transport was made (a try counted in
    -- `attempts`); NULL before it, and again after `sekali outbox retry` of a dead row. With the
    -- HTTP email API the relay sends no try past this plus the API's key lifetime (24 h). Added
    -- in version 3.
    first_tried_at    TEXT
);

CREATE INDEX IF NOT EXISTS email_outbox_due ON email_outbox (status, next_attempt_at);
-- The key is unique. It already contains the order id, so uniqueness per order is the same
-- guarantee; but indexed behind the order id, a new row lands next to its order's neighbours
-- instead of on a random leaf page (a hash is random), which every commit would write out.
CREATE UNIQUE INDEX IF NOT EXISTS email_outbox_order_key ON email_outbox (order_id, idempotency_key);


-- Forwarding of order changes to the shop's endpoint (docs/forwarding.md). While this table has
-- its one row, every order change (order_transitions) also gets a row in forward_outbox, in the
-- change's transaction. `sekali serve` puts the row in place when it starts with
-- SEKALI_FORWARD_URL set, and removes it when it starts without; changes made while it is absent
-- are not forwarded (the change feed, GET /changes, has them). Added in version 8.
CREATE TABLE IF NOT EXISTS forward_state (
    only_row          INTEGER PRIMARY KEY CHECK (only_row = 1),
    -- When forwarding was turned on.
    since             TEXT NOT NULL
);

-- Order changes to forward, and what became of each: one row per change while forwarding is on.
-- Sent in order per order: a row is claimed only while no earlier row of its order is pending or
-- dead, so a dead row holds its order's later changes until it is retried or skipped
-- (`sekali forward retry|skip ID`). The message's webhook-id is 'chg_' || change_id, the same on
-- every attempt; its body is the change as GET /changes serves it. Added in version 8.
CREATE TABLE IF NOT EXISTS forward_outbox (
    id                INTEGER PRIMARY KEY,
    -- The change forwarded (order_transitions.id).
    change_id         INTEGER NOT NULL UNIQUE REFERENCES order_transitions (id),
    order_id          TEXT NOT NULL,
    -- pending: waiting to be sent (again); sent: the endpoint answered 2xx; dead: a permanent
    -- refusal or the attempt limit (see last_error); skipped: an operator skipped it.
    status            TEXT NOT NULL DEFAULT 'pending'
                      CHECK (status = 'pending' OR status = 'sent' OR status = 'dead'
                             OR status = 'skipped'),
    -- Tries so far (an unreachable endpoint, or a lease running out, is not a try).
    attempts          INTEGER NOT NULL DEFAULT 0,
    created_at        TEXT NOT NULL,
    -- The timing columns as email_outbox's: fixed-width millisecond UTC. NULL once finished.
    next_attempt_at   TEXT,
    lease_owner       TEXT,
    lease_until       TEXT,
    last_error        TEXT,
    sent_at           TEXT,
    first_tried_at    TEXT
);

CREATE INDEX IF NOT EXISTS forward_outbox_due ON forward_outbox (status, next_attempt_at);
-- An order's unfinished rows, which hold its later ones.
CREATE INDEX IF NOT EXISTS forward_outbox_order ON forward_outbox (order_id, id)
    WHERE status = 'pending' OR status = 'dead';

-- Every result a relay recorded for a row of email_outbox or forward_outbox, oldest first: what
-- each try did, where the outbox rows keep only the number of tries and the last error. Written
-- in the transaction that records the result. Never purged, as the outboxes are not. Added in
-- version 9.
CREATE TABLE IF NOT EXISTS outbox_attempts (
    id                INTEGER PRIMARY KEY,
    outbox            TEXT NOT NULL CHECK (outbox = 'email' OR outbox = 'forward'),
    -- email_outbox.id or forward_outbox.id.
    row_id            INTEGER NOT NULL,
    -- When it was recorded: fixed-width millisecond UTC.
    at                TEXT NOT NULL,
    -- The relay (its lease owner) that recorded it.
    relay             TEXT NOT NULL,
    -- sent: the transport confirmed it; failed: a counted try failed, tried again later; dead: a
    -- counted try failed, the last; unavailable: the transport could not be reached, no try
    -- counted; withheld: not sent, no try counted, and not tried again (dead); skipped: no
    -- recipient address.
    result            TEXT NOT NULL CHECK (result = 'sent' OR result = 'failed' OR result = 'dead'
                                           OR result = 'unavailable' OR result = 'withheld'
                                           OR result = 'skipped'),
    error             TEXT
);

CREATE INDEX IF NOT EXISTS outbox_attempts_row ON outbox_attempts (outbox, row_id);

-- Console sessions logged out of before they ran out (docs/console.md). A session is a signed
-- cookie that any instance accepts; each instance also looks here, so a copy of the cookie is
-- worthless once its operator logged out. A row is deleted once its session would have ended
-- anyway. Added in version 9.
CREATE TABLE IF NOT EXISTS console_logouts (
    -- Hex SHA-256 of the session cookie's value (never the value itself).
    session           TEXT PRIMARY KEY NOT NULL,
    -- When the session would have ended: fixed-width second UTC.
    expires_at        TEXT NOT NULL
) WITHOUT ROWID;

-- Idempotency-Key records for sekali's own API (POST /orders), per calling client. The claim,
-- the work and the stored response commit in one transaction, so a row is always complete
-- (status 'completed'); a retry with the same key and request gets response_body back byte for
-- byte. A row past expires_at counts as absent; the purge removes it.
CREATE TABLE IF NOT EXISTS idempotency_keys (
    client                TEXT NOT NULL,
    key                   TEXT NOT NULL,
    -- hex SHA-256 of "METHOD path\n" + the RFC 8785 (JCS) form of the JSON body.
    fingerprint           TEXT NOT NULL,
    status                TEXT NOT NULL CHECK (status IN ('completed')),
    response_status       INTEGER NOT NULL,
    response_body         TEXT NOT NULL,
    response_content_type TEXT NOT NULL,
    created_at            TEXT NOT NULL,
    expires_at            TEXT NOT NULL,
    PRIMARY KEY (client, key)
);

CREATE INDEX IF NOT EXISTS idempotency_keys_expires_at ON idempotency_keys (expires_at);
