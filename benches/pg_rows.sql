-- The rows sekali writes for one new paid order (a Stripe payment_intent.succeeded with a receipt
-- email), for a batch of :b deliveries, as benches/pg_ceiling.sh runs it through pgbench against
-- sekali's PostgreSQL schema: the event's claim with its body (about 1 KB, as the load
-- generator's), the payment, the order, its change in the audit trail and its email in the
-- outbox (one transaction, as the writer commits a batch); then the relay's claim of the emails
-- (a lease) and its results, with their attempts (a transaction each). The same rows, indexes,
-- checks and foreign keys as sekali's, with none of its reads. Each statement is a paragraph of
-- its own: the per-delivery form repeats a paragraph for each delivery (g from k to k).
\set n random(1, 1000000000000)

BEGIN;

INSERT INTO processed_events (provider, event_id, event_type, order_id, outcome, received_at,
                              expires_at, payment_intent_id, payload, headers)
  SELECT 'stripe', 'evt_' || :n || '_' || g, 'payment_intent.succeeded', 'o_' || :n || '_' || g,
         'processed', '2026-12-07T21:01:20Z', '2027-01-06T21:01:20Z', 'pi_' || :n || '_' || g,
         rpad('{"id": "evt_' || :n || '_' || g || '"', 1050, ' x'),
         '{"content-type":"application/json","user-agent":"Stripe/1.0 (+https://stripe.com/docs/webhooks)"}'
  FROM generate_series(1, :b) g;

INSERT INTO payments (provider, payment_ref, order_id, currency, requested, captured, captured_at,
                      created_at, updated_at)
  SELECT 'stripe', 'pi_' || :n || '_' || g, 'o_' || :n || '_' || g, 'USD', 2500, 2500,
         '2024-11-29T08:46:40Z', '2026-12-07T21:01:20Z', '2026-12-07T21:01:20Z'
  FROM generate_series(1, :b) g;

INSERT INTO orders (order_id, provider, status, amount, currency, customer_email,
                    payment_intent_id, created_at, updated_at, last_event_id, paid_amount,
                    paid_currency, amount_exponent, payer_email)
  SELECT 'o_' || :n || '_' || g, 'stripe', 'paid', 2500, 'USD', 'c' || :n || '_' || g || '@example.com',
         'pi_' || :n || '_' || g, '2026-12-07T21:01:20Z', '2026-12-07T21:01:20Z',
         'evt_' || :n || '_' || g, 2500, 'USD', 2, 'c' || :n || '_' || g || '@example.com'
  FROM generate_series(1, :b) g;

INSERT INTO order_transitions (order_id, to_status, refunded_amount, provider, event_id,
                               changed_at, sequence, amount, currency)
  SELECT 'o_' || :n || '_' || g, 'paid', 0, 'stripe', 'evt_' || :n || '_' || g,
         '2026-12-07T21:01:20Z', 1, 2500, 'USD'
  FROM generate_series(1, :b) g;

INSERT INTO email_outbox (order_id, recipient, template, params, idempotency_key, created_at,
                          event_id, next_attempt_at)
  SELECT 'o_' || :n || '_' || g, 'c' || :n || '_' || g || '@example.com', 'receipt',
         rpad('{"amount":2500,"currency":"USD","event_id":"evt_' || :n || '_' || g || '"', 200, ' '),
         md5(:n || '_' || g) || md5(g || '_' || :n), '2026-12-07T21:01:20Z',
         'evt_' || :n || '_' || g, '2026-12-07T21:01:20.000Z'
  FROM generate_series(1, :b) g;

COMMIT;

BEGIN;

UPDATE email_outbox SET lease_owner = 'relay', lease_until = '2026-12-07T21:02:20.000Z'
  WHERE id IN (SELECT id FROM email_outbox
               WHERE order_id = ANY (ARRAY(SELECT 'o_' || :n || '_' || g FROM generate_series(1, :b) g))
               FOR UPDATE SKIP LOCKED);

COMMIT;

BEGIN;

WITH sent AS (
  UPDATE email_outbox SET status = 'sent', attempts = attempts + 1,
         sent_at = '2026-12-07T21:01:21.819Z', first_tried_at = '2026-12-07T21:01:21.819Z',
         lease_owner = NULL, lease_until = NULL, next_attempt_at = NULL
  WHERE order_id = ANY (ARRAY(SELECT 'o_' || :n || '_' || g FROM generate_series(1, :b) g))
    AND lease_owner = 'relay'
  RETURNING id)
INSERT INTO outbox_attempts (outbox, row_id, at, relay, result)
  SELECT 'email', id, '2026-12-07T21:01:21.765Z', 'relay', 'sent' FROM sent;

COMMIT;
