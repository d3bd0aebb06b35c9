"""A shop's endpoint for the forwarding tests (tests/api/forward.rs).

    forward_receiver.py SECRET FAIL_RATIO LOGFILE [--port N] [--delay-ms MS]
                        [--refuse ORDER_ID:SEQUENCE[:FLAG]]...
                        [--answer ORDER_ID:SEQUENCE:STATUS[:RETRY_AFTER]]...

Verifies every message with the official Standard Webhooks package (SECRET, whsec_...), then:
answers 400 to a message that does not verify ("rejected"); 410 to a message of a refused order
change ("refused": --refuse ORDER_ID:SEQUENCE, while the file FLAG exists when one is given);
STATUS to a message of an order change given with --answer ("answered", with a Retry-After
header of RETRY_AFTER when given); 500 to a fraction FAIL_RATIO of the others at random
("failed"); 200 to the rest ("accepted"). Every answer is appended to LOGFILE as one JSON line,
written before the answer is sent (--delay-ms later), so the log's order is the order in which
messages were answered: {"answer", "id" (webhook-id), "order_id", "sequence", "signatures" (how
many the webhook-signature header carries), "at" (Unix time, seconds, fractional), "body" (the
parsed JSON, for accepted messages), "status" (for "answered")}.

Prints the port it listens on (--port, or one of the system's choosing), then serves until
killed. It sets SO_REUSEADDR, so it can be started again on the port of one that was killed.
"""
import argparse
import json
import os
import random
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks.webhooks import Webhook

parser = argparse.ArgumentParser()
parser.add_argument("secret")
parser.add_argument("fail_ratio", type=float)
parser.add_argument("log_path")
parser.add_argument("--port", type=int, default=0)
parser.add_argument("--delay-ms", type=int, default=0)
parser.add_argument("--refuse", action="append", default=[])
parser.add_argument("--answer", action="append", default=[])
args = parser.parse_args()

wh = Webhook(args.secret)
lock = threading.Lock()
log = open(args.log_path, "a")
refusals = []
for spec in args.refuse:
    parts = spec.split(":", 2)
    refusals.append((parts[0], int(parts[1]), parts[2] if len(parts) > 2 else None))


answers = {}
for spec in args.answer:
    parts = spec.split(":", 3)  # a Retry-After date has colons of its own
    answers[(parts[0], int(parts[1]))] = (int(parts[2]), parts[3] if len(parts) > 3 else None)


def refused(change):
    for order_id, sequence, flag in refusals:
        if change.get("order_id") == order_id and change.get("sequence") == sequence:
            if flag is None or os.path.exists(flag):
                return True
    return False


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        headers = {k.lower(): v for k, v in self.headers.items()}
        entry = {
            "id": headers.get("webhook-id"),
            "signatures": len(headers.get("webhook-signature", "").split()),
        }
        try:
            change = wh.verify(body, headers)
        except Exception as e:
            self.answer(dict(entry, answer="rejected", reason=str(e)), 400, b"not verified")
            return
        entry.update(order_id=change.get("order_id"), sequence=change.get("sequence"))
        answer = answers.get((change.get("order_id"), change.get("sequence")))
        if refused(change):
            self.answer(dict(entry, answer="refused"), 410, b"gone: this shop refuses it")
        elif answer is not None:
            status, retry_after = answer
            entry.update(answer="answered", status=status)
            self.answer(entry, status, b"not now", retry_after)
        elif random.random() < args.fail_ratio:
            self.answer(dict(entry, answer="failed"), 500, b"try again")
        else:
            self.answer(dict(entry, answer="accepted", body=change), 200, b"")

    def answer(self, entry, status, text, retry_after=None):
        with lock:
            log.write(json.dumps(dict(entry, at=time.time())) + "\n")
            log.flush()
        if args.delay_ms:
            time.sleep(args.delay_ms / 1000)
        self.send_response(status)
        if retry_after is not None:
            self.send_header("retry-after", retry_after)
        self.send_header("content-length", str(len(text)))
        self.end_headers()
        self.wfile.write(text)

    def log_message(self, *a):
        pass


class Server(ThreadingHTTPServer):
    # A batch of messages comes at once: more than the default 5 waiting connections.
    request_queue_size = 256
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        # sekali killed (as a test does) while a message was answered: not the receiver's error.
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


server = Server(("127.0.0.1", args.port), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
