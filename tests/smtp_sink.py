"""An SMTP sink for the relay tests, on aiosmtpd (PyPI; .ci/run installs it).

usage: python3 tests/smtp_sink.py PORT OUT_DIR

Accepts every message and writes it to OUT_DIR/<n>.eml, except by recipient:
  reject@...    RCPT answered 550 (a permanent failure)
  tempfail@...  RCPT answered 451 the first two times, then accepted (transient)
AUTH (PLAIN/LOGIN, allowed without TLS on loopback) accepts only sekali / right-password;
clients that do not authenticate may still send.
Prints "ready" once listening.
"""
import sys
import time
from pathlib import Path

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword


class Sink:
    def __init__(self, out):
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.count = 0
        self.tempfails = {}

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        local = address.split("@")[0]
        if local == "reject":
            return "550 5.1.1 mailbox unavailable"
        if local == "tempfail":
            seen = self.tempfails.get(address, 0)
            self.tempfails[address] = seen + 1
            if seen < 2:
                return "451 4.3.0 try again later"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):
        self.count += 1
        path = self.out / f"{self.count:05d}.eml"
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(envelope.original_content or envelope.content)
        tmp.rename(path)
        return "250 Message accepted"


def authenticator(server, session, envelope, mechanism, auth_data):
    ok = isinstance(auth_data, LoginPassword) and auth_data.login == b"sekali" and auth_data.password == b"right-password"
    # handled=False: let aiosmtpd answer 535 itself (the default, True, sends no reply at all).
    return AuthResult(success=ok, handled=False)


if __name__ == "__main__":
    port, out = int(sys.argv[1]), sys.argv[2]
    controller = Controller(
        Sink(out), hostname="127.0.0.1", port=port, authenticator=authenticator, auth_require_tls=False
    )
    controller.start()
    print("ready", flush=True)
    try:
        while True:
            time.sleep(3600)
    finally:
        controller.stop()
