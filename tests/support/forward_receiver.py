"""A shop's endpoint for tests: verifies every message with the official Standard Webhooks
package, answers 500 to a fraction of them at random, and logs what it accepted as JSON lines."""
import json, random, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from standardwebhooks.webhooks import Webhook

secret, fail_ratio, log_path = sys.argv[1], float(sys.argv[2]), sys.argv[3]
wh = Webhook(secret)
lock = threading.Lock()
log = open(log_path, "a")

class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        headers = {k.lower(): v for k, v in self.headers.items()}
        try:
            wh.verify(body, headers)
        except Exception as e:
            with lock:
                log.write(json.dumps({"rejected": str(e), "id": headers.get("webhook-id")}) + "\n"); log.flush()
            self.send_response(400); self.end_headers(); return
        if random.random() < fail_ratio:
            self.send_response(500); self.end_headers(); return
        with lock:
            log.write(json.dumps({"id": headers["webhook-id"], "body": json.loads(body)}) + "\n"); log.flush()
        self.send_response(200); self.end_headers()
    def log_message(self, *a): pass

server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
