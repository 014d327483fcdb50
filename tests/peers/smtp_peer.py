#!/usr/bin/env python3
"""A real SMTP server for the email tests (aiosmtpd), on 127.0.0.1.

Prints "PORT <n>" once it listens, then appends one JSON line per accepted
message to the --record file. Behaviour is chosen by the recipient's local
part, so one server serves every test case:

  unknown@...   RCPT answered 550 5.1.1 (user unknown)        -> rejected
  greylist@...  RCPT answered 451 4.7.1 the first time only     -> transient, then delivered
  drop@...      the whole message is received, then the connection
                is closed without a reply                        -> ambiguous
  anything else 250 2.0.0 Ok: queued as <ID>                     -> delivered

With --drop-rate P, any message is dropped like drop@... with probability P
(the chaos drill's flaky mail server).
"""
import argparse
import asyncio
import itertools
import json
import random
import socket
import sys

from aiosmtpd.controller import Controller


class Handler:
    def __init__(self, record, drop_rate=0.0):
        self.record = record
        self.drop_rate = drop_rate
        self.greylisted = set()
        self.ids = itertools.count(0xA000)

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        local = address.split("@", 1)[0].lower()
        if local == "unknown":
            return "550 5.1.1 <%s>: Recipient address rejected: User unknown" % address
        if local == "greylist" and address not in self.greylisted:
            self.greylisted.add(address)
            return "451 4.7.1 <%s>: Greylisted, try again later" % address
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):
        data = envelope.original_content or envelope.content
        text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
        if any(r.split("@", 1)[0].lower() == "drop" for r in envelope.rcpt_tos) or (
            self.drop_rate > 0 and random.random() < self.drop_rate
        ):
            self.write(envelope, text, None, dropped=True)
            server.transport.abort()
            return "250 OK (never sent)"
        queue_id = "%X" % next(self.ids)
        self.write(envelope, text, queue_id, dropped=False)
        return "250 2.0.0 Ok: queued as %s" % queue_id

    def write(self, envelope, text, queue_id, dropped):
        with open(self.record, "a", encoding="utf-8") as f:
            f.write(json.dumps({
                "mail_from": envelope.mail_from,
                "rcpt_tos": list(envelope.rcpt_tos),
                "data": text,
                "queue_id": queue_id,
                "dropped": dropped,
            }) + "\n")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--record", required=True)
    parser.add_argument("--drop-rate", type=float, default=0.0)
    args = parser.parse_args()
    port = free_port()
    controller = Controller(Handler(args.record, args.drop_rate), hostname="127.0.0.1", port=port)
    controller.start()
    print("PORT %d" % port, flush=True)
    try:
        # serve until killed or until stdin closes (the test ended)
        sys.stdin.read()
    finally:
        controller.stop()


if __name__ == "__main__":
    main()
