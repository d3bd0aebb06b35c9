-- sekali schema, version 6 (PRAGMA user_version = 6).
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
    -- when it names none, or while its payment is linked to no order (parked events, until
    -- applied).
    order_id          TEXT,
    -- processed: effects applied (possibly none, when the status was already reached);
    -- stale: would have moved the order backwards (or reports no new refund), changed nothing;
    -- ignored: an event type sekali does not act on, or no order reference;
    -- parked: a Stripe charge or dispute whose payment is not linked to an order yet; applied
    --         (and its outcome updated) in the transaction that first links it.
    -- amount_mismatch: a payment for an order created through the API whose amount or currency
    --         differs from the order's; the order went to needs_review instead of paid.
    -- reversed: the provider reversed the payment that paid the order (a Midtrans deny or cancel
    --         of that transaction after its settlement); the order went from paid to
    --         needs_review, and no email was queued.
    outcome           TEXT NOT NULL CHECK (outcome = 'processed' OR outcome = 'stale'
                          OR outcome = 'ignored' OR outcome = 'parked'
                          OR outcome = 'amount_mismatch' OR outcome = 'reversed'),
    received_at       TEXT NOT NULL,
    -- received_at plus the provider's retention; the purge deletes rows past it (never parked
    -- rows), and a redelivery after it is treated as a new event.
    expires_at        TEXT NOT NULL,
    -- The payment the event refers to, if any: a Stripe PaymentIntent (pi_...), or for a charge
    -- made with the Charges API, which has none, the charge (ch_...); a Midtrans transaction_id.
    -- How parked events find their order.
    payment_intent_id TEXT,
    -- The raw request body exactly as received and verified.
    payload           TEXT NOT NULL,
    -- A parked event, normalised (JSON): what is applied when its payment is linked, without
    -- reading the payload again. NULL for every other outcome. Added in version 5.
    parked_event      TEXT,
    PRIMARY KEY (provider, event_id)
);

-- Indexes cost every delivery a B-tree insert, so only those the service itself needs exist:
-- the purge's (expires_at) and the parked lookup. Listing uses rowid, which is arrival order.
CREATE INDEX IF NOT EXISTS processed_events_expires_at ON processed_events (expires_at);
CREATE INDEX IF NOT EXISTS processed_events_parked
    ON processed_events (payment_intent_id) WHERE outcome = 'parked';

-- The shop's orders, created through the API (POST /orders) or first seen in a webhook, and
-- moved by the webhooks. Never purged.
CREATE TABLE IF NOT EXISTS orders (
    order_id          TEXT PRIMARY KEY NOT NULL,
    provider          TEXT NOT NULL,
    -- Forward-only (src/domain/order.rs): pending -> paid | failed | cancelled | expired |
    -- needs_review; failed -> paid | cancelled | expired | needs_review; expired -> paid |
    -- needs_review; paid -> partially_refunded | refunded | disputed; partially_refunded ->
    -- refunded | disputed; and a reversal, paid -> needs_review (src/domain/decision.rs).
    -- needs_review: a payment did not match an API order's amount or currency, or a paid order's
    -- payment was reversed; only an operator moves it on (sekali orders set-status).
    status            TEXT NOT NULL CHECK (status = 'pending' OR status = 'paid'
                          OR status = 'failed' OR status = 'cancelled' OR status = 'expired'
                          OR status = 'partially_refunded' OR status = 'refunded'
                          OR status = 'disputed' OR status = 'needs_review'),
    amount            INTEGER,
    refunded_amount   INTEGER NOT NULL DEFAULT 0,
    currency          TEXT,
    customer_email    TEXT,
    -- The payment that paid the order, else the first one linked to it: a Stripe PaymentIntent
    -- or Charges API charge, a Midtrans transaction_id (all of them: order_payment_intents). A
    -- reversal must name it.
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
    -- What the payment that moved the order to paid (or to needs_review for a mismatch) said
    -- was paid, and in which currency: what the receipt shows. NULL before a payment, and for
    -- orders paid before version 4. Added in version 4.
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
    payer_email       TEXT
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
    reason            TEXT
);

-- An order's history (GET /orders/{id}) reads its transitions in order. Added in version 6.
CREATE INDEX IF NOT EXISTS order_transitions_order ON order_transitions (order_id, id);


-- Every payment seen with an order: a Stripe PaymentIntent (pi_...) or, for charges made with
-- the Charges API, which have none, the charge (ch_...); a Midtrans transaction_id. Stripe
-- charges and disputes that carry no order id are resolved through it.
CREATE TABLE IF NOT EXISTS order_payment_intents (
    payment_intent_id TEXT PRIMARY KEY NOT NULL,
    order_id          TEXT NOT NULL REFERENCES orders (order_id)
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
    -- decimals), refunded_amount, refunded_currency, provider, event_id.
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
