-- sekali schema, version 10, for PostgreSQL 15: the translation of the top-level schema.sql
-- (SQLite, PRAGMA user_version = 10). Same tables, same column names in the same order (but for
-- processed_events.rowid, PostgreSQL's own, before the column added after it), same
-- meaning and the same constraints, so that psql users see the tables an sqlite3 user sees.
--
-- Applied at startup, idempotently (every statement is IF NOT EXISTS; loading it twice changes
-- nothing). It opens no transaction of its own, so the engine can run it inside one. Two
-- processes running it at once on a new database can fail with a unique violation in the
-- catalog (CREATE ... IF NOT EXISTS is not safe against a concurrent creation), so the engine
-- should hold an advisory lock while it runs it.
--
-- Table and column names are part of sekali's interface: operators query them with psql as
-- they do with sqlite3.
--
-- Where PostgreSQL differs from SQLite, and what this file does about it:
-- * Types. SQLite's INTEGER (64-bit) is BIGINT; TEXT stays TEXT, JSON included (not jsonb), so
--   the code reads back the same strings, byte for byte, on both engines. This schema has no
--   BLOB column.
-- * Booleans. The columns holding 0 or 1 (payments.undone, payment_disputes.withdrawn and
--   .reinstated) stay BIGINT, as SQLite stores them, with no CHECK, as SQLite has none: the
--   engine binds and reads them as integers on both engines.
-- * Times are ISO-8601 UTC text, YYYY-MM-DDTHH:MM:SSZ (the outbox relay's columns with
--   milliseconds, YYYY-MM-DDTHH:MM:SS.mmmZ), not timestamptz: fixed width, so they sort as text,
--   and the code reads the same strings on both engines.
-- * Collation. Every TEXT column is COLLATE "C": byte order, as SQLite's default BINARY
--   collation, whatever the database's default collation is (a locale's collation such as
--   en_US.UTF-8 ignores punctuation at first and sorts case-insensitively at first). The code
--   compares fixed-width times as text (expires_at <= ?, lease_until > ?), orders by ids
--   (ORDER BY order_id, ORDER BY provider) and pages through orders with a text cursor
--   (order_id > ?): each must give the order SQLite gives.
-- * Row ids. SQLite's INTEGER PRIMARY KEY (order_transitions.id, email_outbox.id) is an
--   identity column, GENERATED ALWAYS: sekali never inserts an id (a copy from SQLite keeping
--   its ids needs OVERRIDING SYSTEM VALUE, then setval on the sequence). Unlike SQLite, an id is
--   never reused (SQLite without AUTOINCREMENT reuses the largest after its row is deleted), a
--   rolled-back insert leaves a gap, and with several writers ids follow the order the inserts
--   ran, not the order they committed.
-- * WITHOUT ROWID is dropped: a PostgreSQL table is a heap, its primary key an index beside it.
--   processed_events has no primary-key rowid in SQLite but an implicit rowid, which sekali uses
--   as arrival order: here that is an explicit column, processed_events.rowid (see there), the
--   only column a psql user sees that an sqlite3 user's SELECT * does not show.
-- * Foreign keys are always enforced. SQLite enforces them only on connections that ask
--   (PRAGMA foreign_keys = ON, which sekali's write connections do; the sqlite3 shell does not).
-- * PRAGMA user_version does not exist: the version is in the table sekali_schema at the end.
--
-- Amounts are integers in minor units of their currency: Stripe's amount as sent (Stripe's own
-- exponents: JPY 5000 is 5,000 yen), Midtrans "10000.00" -> 1000000 and Xendit 150000 (main
-- units) -> 15000000 (ISO 4217: IDR has two).
-- CHECKs over more than two values are OR chains, not IN lists, as in SQLite's schema (there an
-- IN list of three or more constants built a temporary B-tree on every row it checked).
-- PostgreSQL has no such cost; the chains are kept so that both engines' constraints read the
-- same.

-- One row per (provider, event id) ever claimed and not yet purged: the deduplication record.
-- A row exists if and only if the event's effects were committed in the same transaction.
CREATE TABLE IF NOT EXISTS processed_events (
    -- The provider's name (stripe, midtrans, xendit): any the registry knows, so not listed in
    -- a CHECK.
    provider          TEXT COLLATE "C" NOT NULL,
    -- Stripe's evt_... id; the derived Midtrans id
    -- order_id:transaction_status:status_code[:fraud_status][:refund identity | :transaction_id],
    -- each part with '\' and ':' escaped as '\\' and '\:' (see src/providers/midtrans.rs);
    -- Xendit's webhook-id header, else {invoice id}:{STATUS} (see src/providers/xendit.rs).
    event_id          TEXT COLLATE "C" NOT NULL,
    -- Stripe's event type; Midtrans' transaction_status; for Xendit, invoice. and the status in
    -- lower case (invoice.paid).
    event_type        TEXT COLLATE "C" NOT NULL,
    -- The order the event names or was found through its payment, ignored events included. NULL
    -- when it names none, or while its payment is linked to no order (parked events).
    order_id          TEXT COLLATE "C",
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
    outcome           TEXT COLLATE "C" NOT NULL CHECK (outcome = 'processed' OR outcome = 'stale'
                          OR outcome = 'ignored' OR outcome = 'parked'
                          OR outcome = 'amount_mismatch' OR outcome = 'reversed'
                          OR outcome = 'needs_review'),
    received_at       TEXT COLLATE "C" NOT NULL,
    -- received_at plus the provider's retention; the purge deletes rows past it (never parked
    -- rows), and a redelivery after it is treated as a new event.
    expires_at        TEXT COLLATE "C" NOT NULL,
    -- The payment the event is about (payments.payment_ref), if any: a Stripe PaymentIntent
    -- (pi_...), a Charges API charge (ch_...), a subscription's invoice (in_...); a Midtrans
    -- transaction_id; a Xendit invoice id.
    payment_intent_id TEXT COLLATE "C",
    -- The raw request body exactly as received and verified.
    payload           TEXT COLLATE "C" NOT NULL,
    -- Unused since version 7 (a parked event's facts wait on its payment); versions 5 and 6 kept
    -- a parked event here in its normalised form.
    parked_event      TEXT COLLATE "C",
    -- PostgreSQL only: arrival order, what SQLite's implicit rowid is to this table (listings go
    -- newest first by it, as received_at cannot: several events share a second). Last, so the
    -- columns before it are SQLite's, in SQLite's order; named rowid so that the same queries
    -- (ORDER BY rowid DESC) run on both engines. A claim made again after its retention takes a
    -- new one (SET rowid = DEFAULT), as it takes max(rowid) + 1 in SQLite. With several writers
    -- it is the order the claims ran, not the order they committed.
    rowid             BIGINT GENERATED ALWAYS AS IDENTITY,
    -- SQLite's headers (added in version 9, after rowid, where a migration adds it).
    headers           TEXT COLLATE "C",
    PRIMARY KEY (provider, event_id)
);

-- Indexes cost every delivery a B-tree insert, so only those the service itself needs exist:
-- the purge's (expires_at), the parked lookup (the events whose outcome a payment's link
-- turns to processed), and an order's events newest first (the console's order page,
-- `sekali events list --order`; version 10). In PostgreSQL also the arrival order's, which
-- SQLite's table B-tree, keyed by rowid, gives for nothing; unique, as a rowid is.
CREATE INDEX IF NOT EXISTS processed_events_expires_at ON processed_events (expires_at);
CREATE INDEX IF NOT EXISTS processed_events_parked
    ON processed_events (payment_intent_id) WHERE outcome = 'parked';
CREATE UNIQUE INDEX IF NOT EXISTS processed_events_rowid ON processed_events (rowid);
CREATE INDEX IF NOT EXISTS processed_events_order
    ON processed_events (order_id, rowid) WHERE order_id IS NOT NULL;

-- The shop's orders, created through the API (POST /orders) or first seen in a webhook, and
-- moved by the webhooks. Never purged. (WITHOUT ROWID in SQLite.)
CREATE TABLE IF NOT EXISTS orders (
    order_id          TEXT COLLATE "C" PRIMARY KEY NOT NULL,
    provider          TEXT COLLATE "C" NOT NULL,
    -- Computed from its payments (src/domain/ledger.rs): with money taken, paid,
    -- partially_refunded or refunded by the money given back, disputed while a dispute holds
    -- money; without, pending, failed, expired or cancelled by how its payments' attempts ended;
    -- needs_review with a review_reason; or what an operator set (operator_status), until
    -- money moves.
    status            TEXT COLLATE "C" NOT NULL CHECK (status = 'pending' OR status = 'paid'
                          OR status = 'failed' OR status = 'cancelled' OR status = 'expired'
                          OR status = 'partially_refunded' OR status = 'refunded'
                          OR status = 'disputed' OR status = 'needs_review'),
    amount            BIGINT,
    refunded_amount   BIGINT NOT NULL DEFAULT 0,
    currency          TEXT COLLATE "C",
    customer_email    TEXT COLLATE "C",
    -- The payment that took the order's money, else the first one linked to it (all of them:
    -- payments.order_id).
    payment_intent_id TEXT COLLATE "C",
    created_at        TEXT COLLATE "C" NOT NULL,
    updated_at        TEXT COLLATE "C" NOT NULL,
    -- The event that last changed the order ('api:<client>' for creation through the API,
    -- 'operator' for sekali orders set-status).
    last_event_id     TEXT COLLATE "C" NOT NULL,
    -- 'api': created by POST /orders (webhooks must then match its amount and currency);
    -- 'webhook': first seen in a webhook.
    source            TEXT COLLATE "C" NOT NULL DEFAULT 'webhook' CHECK (source IN ('webhook', 'api')),
    -- The JSON object given at creation through the API, if any (text, as received).
    metadata          TEXT COLLATE "C",
    -- What its payments took, in the order's units, and in which currency: what the receipt
    -- shows. NULL before a payment, and for orders paid before version 4.
    -- refunded_amount above is the money given back, in the order's units too.
    paid_amount       BIGINT,
    paid_currency     TEXT COLLATE "C",
    -- Decimals of the order's amounts in its provider's minor units (Stripe's own table, else
    -- ISO 4217: JPY 0, IDR 2, BHD 3). NULL for orders written before version 5 (their emails
    -- then use ISO 4217).
    amount_exponent   BIGINT,
    -- The payer's address as the provider last reported it. customer_email is where the
    -- customer's emails go: the shop's own address for an order created through the API with
    -- one (a webhook never overwrites it), else the payer's.
    payer_email       TEXT COLLATE "C",
    -- Why the order needs a look (status needs_review): two payments took money, money taken
    -- after a cancel, a payment that does not match the order, a reversal, more given back than
    -- taken, a refund the customer was told of that failed. NULL otherwise.
    review_reason     TEXT COLLATE "C",
    -- An operator's decision (sekali orders set-status): the status, and the money the order
    -- showed then (JSON: captured, returned, withdrawn, ISO 4217 minor units); it stands until
    -- money moves. NULL otherwise.
    operator_status   TEXT COLLATE "C",
    operator_money    TEXT COLLATE "C",
    -- Review reasons an operator has decided on (a JSON array of their texts): they no longer
    -- count.
    acknowledged      TEXT COLLATE "C",
    -- Money given back that the customer was told of by refund notices (ISO 4217 minor units of
    -- the payments' currency).
    announced_returned BIGINT NOT NULL DEFAULT 0
);


-- Every status change of every order, in the transaction that made it: the audit trail.
-- from_status is NULL when the event created the order. One row per change, so
-- `email_outbox` holds exactly one row per change to a status that has a notice.
CREATE TABLE IF NOT EXISTS order_transitions (
    -- INTEGER PRIMARY KEY (the rowid) in SQLite; see "Row ids" above.
    id                BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_id          TEXT COLLATE "C" NOT NULL REFERENCES orders (order_id),
    from_status       TEXT COLLATE "C",
    to_status         TEXT COLLATE "C" NOT NULL,
    -- The order's cumulative refunded amount after the change.
    refunded_amount   BIGINT NOT NULL,
    -- Who made the change: a provider's name with its event id; 'api' with 'api:<client>'
    -- (creation through the orders API); 'operator' with 'operator' (sekali orders set-status).
    provider          TEXT COLLATE "C" NOT NULL,
    event_id          TEXT COLLATE "C" NOT NULL,
    changed_at        TEXT COLLATE "C" NOT NULL,
    -- For an operator's change, the operator's name (--by, else the OS user); for the API's,
    -- the client's name. NULL for a provider's event.
    actor             TEXT COLLATE "C",
    -- Why an operator made the change (--reason, required). NULL otherwise.
    reason            TEXT COLLATE "C",
    -- The order's change number: 1 for the change that created it, then 2, 3, ...
    sequence          BIGINT,
    -- The order's amount and currency at the change.
    amount            BIGINT,
    currency          TEXT COLLATE "C",
    -- The change's place in the change feed (GET /changes), given once it has committed (NULL
    -- until then; see orders::publish_changes). Identity values are not commit order when several
    -- instances write; places given to committed changes only, one publisher at a time, are.
    -- A copy from SQLite gives each change its id (SQLite's feed order, and its cursors).
    position          BIGINT
);

-- An order's history (GET /orders/{id}) reads its transitions in order.
CREATE INDEX IF NOT EXISTS order_transitions_order ON order_transitions (order_id, id);
-- The change feed: by place, and the changes not yet given one, in id order.
CREATE UNIQUE INDEX IF NOT EXISTS order_transitions_feed ON order_transitions (position);
CREATE INDEX IF NOT EXISTS order_transitions_unpublished ON order_transitions (id)
    WHERE position IS NULL;


-- The ledger (src/domain/ledger.rs): every payment sekali has heard of, one row per
-- (provider, payment_ref), holding what every event said of it, merged so that the order of
-- delivery cannot matter. An order's status is computed from its payments. Amounts are in ISO
-- 4217 minor units of the payment's currency (Stripe's ISK 50000 is ISK 500 here); times are
-- the events' own (when the provider says), NULL when unknown. Never purged. (WITHOUT ROWID in
-- SQLite.)
CREATE TABLE IF NOT EXISTS payments (
    provider          TEXT COLLATE "C" NOT NULL,
    -- A Stripe PaymentIntent (pi_...), a Charges API charge (ch_...) or a subscription's first
    -- invoice (in_...); a Midtrans transaction_id ('order:' and the order id for a notification
    -- that named none); a Xendit invoice id.
    payment_ref       TEXT COLLATE "C" NOT NULL,
    -- The order it pays; NULL until an event names both (its events are then 'parked').
    order_id          TEXT COLLATE "C",
    currency          TEXT COLLATE "C",
    -- What it asked for; what it must take to be paid in full when that differs (a Xendit
    -- invoice's amount); what it held on the card without taking it.
    requested         BIGINT,
    expected          BIGINT,
    authorized        BIGINT,
    -- Money taken from the customer, cumulative, and when first taken.
    captured          BIGINT NOT NULL DEFAULT 0,
    captured_at       TEXT COLLATE "C",
    -- An authorisation given back without being taken (a cancelled uncaptured payment, a
    -- partial capture's remainder); and the part of the refunds that was such a release (Stripe
    -- before API version 2025-03-31.basil made a Refund of it). Neither is money returned.
    released          BIGINT NOT NULL DEFAULT 0,
    released_as_refunds BIGINT NOT NULL DEFAULT 0,
    -- How far it got without taking money (pending, failed, expired, canceled), and when.
    attempt           TEXT COLLATE "C" NOT NULL DEFAULT 'pending'
                          CHECK (attempt = 'pending' OR attempt = 'failed'
                                 OR attempt = 'expired' OR attempt = 'canceled'),
    attempt_at        TEXT COLLATE "C",
    -- 1 when the provider said it did not stand (a Midtrans deny or cancel): with money taken,
    -- a reversal. A 0/1 integer, not boolean, as in SQLite.
    undone            BIGINT NOT NULL DEFAULT 0,
    -- A charge's cumulative refunded amount as last reported, and when (Stripe), for refunds
    -- whose ids no event listed.
    refunded_reported BIGINT,
    refunded_reported_at TEXT COLLATE "C",
    -- Computed from the above and its refunds and disputes, for readers: money given back,
    -- and money disputes or a reversal took back.
    returned          BIGINT NOT NULL DEFAULT 0,
    withdrawn         BIGINT NOT NULL DEFAULT 0,
    -- How many rows it has in payment_refunds and payment_disputes.
    refund_count      BIGINT NOT NULL DEFAULT 0,
    dispute_count     BIGINT NOT NULL DEFAULT 0,
    created_at        TEXT COLLATE "C" NOT NULL,
    updated_at        TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (provider, payment_ref)
);

-- An order's payments, read to compute it.
CREATE INDEX IF NOT EXISTS payments_order ON payments (order_id) WHERE order_id IS NOT NULL;

-- Each refund of a payment by its id, in its furthest state: pending < succeeded < failed (a
-- refund can fail after it was reported succeeded). failed_at: when the failure was reported.
-- (WITHOUT ROWID in SQLite.)
CREATE TABLE IF NOT EXISTS payment_refunds (
    provider          TEXT COLLATE "C" NOT NULL,
    payment_ref       TEXT COLLATE "C" NOT NULL,
    refund_id         TEXT COLLATE "C" NOT NULL,
    amount            BIGINT NOT NULL,
    state             TEXT COLLATE "C" NOT NULL CHECK (state = 'pending' OR state = 'succeeded'
                                           OR state = 'failed'),
    failed_at         TEXT COLLATE "C",
    PRIMARY KEY (provider, payment_ref, refund_id)
);

-- Each dispute of a payment by its id, in its furthest stage: inquiry < inquiry_closed < open
-- < won | lost; withdrawn and reinstated say the provider reported the funds taken and given
-- back (0/1 integers, not booleans, as in SQLite). A Midtrans chargeback is a dispute lost, its
-- funds withdrawn. (WITHOUT ROWID in SQLite.)
CREATE TABLE IF NOT EXISTS payment_disputes (
    provider          TEXT COLLATE "C" NOT NULL,
    payment_ref       TEXT COLLATE "C" NOT NULL,
    dispute_id        TEXT COLLATE "C" NOT NULL,
    amount            BIGINT NOT NULL,
    stage             TEXT COLLATE "C" NOT NULL CHECK (stage = 'inquiry' OR stage = 'inquiry_closed'
                                           OR stage = 'open' OR stage = 'won' OR stage = 'lost'),
    withdrawn         BIGINT NOT NULL,
    reinstated        BIGINT NOT NULL,
    PRIMARY KEY (provider, payment_ref, dispute_id)
);

-- Work a migration left for a sekali that can do it: 'ledger', the ledger's rebuild from the
-- stored events, which needs each provider to read its bodies again (src/store/sqlite/rebuild.rs).
-- A PostgreSQL database starts at version 7, so nothing writes here unless it was copied from
-- an SQLite database with the row. (WITHOUT ROWID in SQLite.)
CREATE TABLE IF NOT EXISTS pending_work (
    name              TEXT COLLATE "C" PRIMARY KEY NOT NULL
);

-- Other references that name a payment (a Stripe invoice's PaymentIntent and charge): facts
-- that arrive under one are the payment's. (WITHOUT ROWID in SQLite.)
CREATE TABLE IF NOT EXISTS payment_aliases (
    provider          TEXT COLLATE "C" NOT NULL,
    alias             TEXT COLLATE "C" NOT NULL,
    payment_ref       TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (provider, alias)
);

-- Customer emails to send, written in the same transaction as the status change they announce.
-- Never purged.
CREATE TABLE IF NOT EXISTS email_outbox (
    -- INTEGER PRIMARY KEY (the rowid) in SQLite; see "Row ids" above.
    id                BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_id          TEXT COLLATE "C" NOT NULL REFERENCES orders (order_id),
    -- NULL when no event carried an address.
    recipient         TEXT COLLATE "C",
    template          TEXT COLLATE "C" NOT NULL CHECK (template = 'receipt' OR template = 'payment_failed'
                          OR template = 'refund_notice'),
    -- JSON object: order_id, status, amount (for a receipt what was paid), currency, exponent (its
    -- decimals), refund_amount (a refund notice's money given back this time), refunded_amount
    -- (in all), refunded_currency, provider, event_id.
    params            TEXT COLLATE "C" NOT NULL,
    -- For the downstream sender (Message-ID, Idempotency-Key header): hex SHA-256 of the
    -- order id, template, status and refunded amount, so one status change yields one key,
    -- whichever event announced it. Unique (email_outbox_order_key below).
    idempotency_key   TEXT COLLATE "C" NOT NULL,
    -- pending: waiting to be sent (again); sent: the transport confirmed it; dead: a permanent
    -- failure or the attempt limit (see last_error; `sekali outbox retry` revives it);
    -- skipped: no recipient.
    status            TEXT COLLATE "C" NOT NULL DEFAULT 'pending'
                          CHECK (status = 'pending' OR status = 'sent' OR status = 'dead'
                                 OR status = 'skipped'),
    -- Transport tries so far (a relay's lease running out is not a try).
    attempts          BIGINT NOT NULL DEFAULT 0,
    created_at        TEXT COLLATE "C" NOT NULL,
    -- The event that caused this email.
    event_id          TEXT COLLATE "C" NOT NULL,
    -- The relay's timing columns use fixed-width millisecond UTC (YYYY-MM-DDTHH:MM:SS.mmmZ) so
    -- they sort as text. next_attempt_at: when a pending row is due; NULL once sent, dead or
    -- skipped.
    next_attempt_at   TEXT COLLATE "C",
    -- The relay holding the row and until when; a row whose lease ran out is claimed again.
    lease_owner       TEXT COLLATE "C",
    lease_until       TEXT COLLATE "C",
    last_error        TEXT COLLATE "C",
    sent_at           TEXT COLLATE "C",
    -- When the first try that may have reached the transport was made (a try counted in
    -- `attempts`); NULL before it, and again after `sekali outbox retry` of a dead row. With the
    -- HTTP email API the relay sends no try past this plus the API's key lifetime (24 h).
    first_tried_at    TEXT COLLATE "C"
);

CREATE INDEX IF NOT EXISTS email_outbox_due ON email_outbox (status, next_attempt_at);
-- The key is unique. It already contains the order id, so uniqueness per order is the same
-- guarantee; but indexed behind the order id, a new row lands next to its order's neighbours
-- instead of on a random leaf page (a hash is random). It is also the conflict target of the
-- insert (ON CONFLICT (order_id, idempotency_key)).
CREATE UNIQUE INDEX IF NOT EXISTS email_outbox_order_key ON email_outbox (order_id, idempotency_key);


-- Forwarding of order changes to the shop's endpoint (docs/forwarding.md). While this table has
-- its one row, every order change (order_transitions) also gets a row in forward_outbox, in the
-- change's transaction. `sekali serve` puts the row in place when it starts with
-- SEKALI_FORWARD_URL set, and removes it when it starts without; changes made while it is absent
-- are not forwarded (the change feed, GET /changes, has them). Added in version 8.
CREATE TABLE IF NOT EXISTS forward_state (
    only_row          BIGINT PRIMARY KEY CHECK (only_row = 1),
    -- When forwarding was turned on.
    since             TEXT COLLATE "C" NOT NULL
);

-- Order changes to forward, and what became of each: one row per change while forwarding is on.
-- Sent in order per order: a row is claimed only while no earlier row of its order is pending or
-- dead, so a dead row holds its order's later changes until it is retried or skipped
-- (`sekali forward retry|skip ID`). The message's webhook-id is 'chg_' || change_id, the same on
-- every attempt; its body is the change as GET /changes serves it. Added in version 8.
CREATE TABLE IF NOT EXISTS forward_outbox (
    -- INTEGER PRIMARY KEY (the rowid) in SQLite; see "Row ids" above.
    id                BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- The change forwarded (order_transitions.id).
    change_id         BIGINT NOT NULL UNIQUE REFERENCES order_transitions (id),
    order_id          TEXT COLLATE "C" NOT NULL,
    -- pending: waiting to be sent (again); sent: the endpoint answered 2xx; dead: a permanent
    -- refusal or the attempt limit (see last_error); skipped: an operator skipped it.
    status            TEXT COLLATE "C" NOT NULL DEFAULT 'pending'
                      CHECK (status = 'pending' OR status = 'sent' OR status = 'dead'
                             OR status = 'skipped'),
    -- Tries so far (an unreachable endpoint, or a lease running out, is not a try).
    attempts          BIGINT NOT NULL DEFAULT 0,
    created_at        TEXT COLLATE "C" NOT NULL,
    -- The timing columns as email_outbox's: fixed-width millisecond UTC. NULL once finished.
    next_attempt_at   TEXT COLLATE "C",
    lease_owner       TEXT COLLATE "C",
    lease_until       TEXT COLLATE "C",
    last_error        TEXT COLLATE "C",
    sent_at           TEXT COLLATE "C",
    first_tried_at    TEXT COLLATE "C"
);

CREATE INDEX IF NOT EXISTS forward_outbox_due ON forward_outbox (status, next_attempt_at);
-- An order's unfinished rows, which hold its later ones.
CREATE INDEX IF NOT EXISTS forward_outbox_order ON forward_outbox (order_id, id)
    WHERE status = 'pending' OR status = 'dead';

-- Every result a relay recorded for an outbox row (see schema.sql). Added in version 9.
CREATE TABLE IF NOT EXISTS outbox_attempts (
    -- INTEGER PRIMARY KEY (the rowid) in SQLite; see "Row ids" above.
    id                BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    outbox            TEXT COLLATE "C" NOT NULL CHECK (outbox = 'email' OR outbox = 'forward'),
    row_id            BIGINT NOT NULL,
    at                TEXT COLLATE "C" NOT NULL,
    relay             TEXT COLLATE "C" NOT NULL,
    result            TEXT COLLATE "C" NOT NULL
                      CHECK (result = 'sent' OR result = 'failed' OR result = 'dead'
                             OR result = 'unavailable' OR result = 'withheld'
                             OR result = 'skipped'),
    error             TEXT COLLATE "C"
);

CREATE INDEX IF NOT EXISTS outbox_attempts_row ON outbox_attempts (outbox, row_id);

-- Console sessions logged out of before they ran out (see schema.sql). Added in version 9.
CREATE TABLE IF NOT EXISTS console_logouts (
    session           TEXT COLLATE "C" PRIMARY KEY NOT NULL,
    expires_at        TEXT COLLATE "C" NOT NULL
);

-- Idempotency-Key records for sekali's own API (POST /orders), per calling client. The claim,
-- the work and the stored response commit in one transaction, so a row is always complete
-- (status 'completed'); a retry with the same key and request gets response_body back byte for
-- byte. A row past expires_at counts as absent; the purge removes it. (A rowid table in SQLite,
-- whose purge deletes by rowid; here it has none, and the purge goes by (client, key).)
CREATE TABLE IF NOT EXISTS idempotency_keys (
    client                TEXT COLLATE "C" NOT NULL,
    key                   TEXT COLLATE "C" NOT NULL,
    -- hex SHA-256 of "METHOD path\n" + the RFC 8785 (JCS) form of the JSON body.
    fingerprint           TEXT COLLATE "C" NOT NULL,
    status                TEXT COLLATE "C" NOT NULL CHECK (status IN ('completed')),
    response_status       BIGINT NOT NULL,
    response_body         TEXT COLLATE "C" NOT NULL,
    response_content_type TEXT COLLATE "C" NOT NULL,
    created_at            TEXT COLLATE "C" NOT NULL,
    expires_at            TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (client, key)
);

CREATE INDEX IF NOT EXISTS idempotency_keys_expires_at ON idempotency_keys (expires_at);

-- PostgreSQL only. PostgreSQL has no PRAGMA user_version, so the schema version lives here: one
-- row, which the engine inserts (8 for this file) once the tables above exist; this file
-- inserts nothing. The unique index on a constant allows at most one row (a second insert
-- fails; INSERT ... ON CONFLICT ((true)) DO NOTHING/UPDATE names it).
CREATE TABLE IF NOT EXISTS sekali_schema (
    version           BIGINT NOT NULL
);

CREATE UNIQUE INDEX IF NOT EXISTS sekali_schema_one_row ON sekali_schema ((true));
