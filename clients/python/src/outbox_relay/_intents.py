"""The intents: one builder per kind, producing exactly the payload the relay reads."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeAlias, runtime_checkable

JSON: TypeAlias = "bool | int | float | str | Sequence[JSON] | Mapping[str, JSON] | None"
"""A value `json.dumps` writes as JSON."""


@runtime_checkable
class IntentLike(Protocol):
    """What `enqueue` takes: a kind and its payload (every builder here is one)."""

    @property
    def kind(self) -> str: ...

    def payload(self) -> dict[str, JSON]: ...


def _text(kind: str, field: str, value: object, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str):
        raise TypeError(f"{kind} {field!r} must be a str, not {type(value).__name__}")


def _string_map(kind: str, field: str, value: Mapping[str, object] | None) -> dict[str, JSON]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"{kind} {field!r} must be a mapping, not {type(value).__name__}")
    out: dict[str, JSON] = {}
    for name, v in value.items():
        if not isinstance(name, str) or not isinstance(v, str):
            raise TypeError(f"{kind} {field!r} maps text to text ({name!r}: {v!r})")
        out[name] = v
    return out


def _addresses(field: str, value: str | Sequence[str] | None) -> list[JSON]:
    if value is None:
        return []
    items = [value] if isinstance(value, str) else list(value)
    for a in items:
        _text("email", field, a)
    return list(items)


@dataclass(frozen=True, kw_only=True)
class Webhook:
    """A `POST` of `body` as JSON to `url`, with extra `headers`.

    Without `url`, the intent names a configured endpoint instead: give
    `destination=` to `enqueue` (one or the other, never both).
    """

    url: str | None = None
    body: JSON
    headers: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        _text("webhook", "url", self.url, optional=True)
        _string_map("webhook", "headers", self.headers)

    @property
    def kind(self) -> str:
        return "webhook"

    def payload(self) -> dict[str, JSON]:
        p: dict[str, JSON] = {}
        if self.url is not None:
            p["url"] = self.url
        p["body"] = self.body
        if self.headers:
            p["headers"] = _string_map("webhook", "headers", self.headers)
        return p


@dataclass(frozen=True, kw_only=True)
class Email:
    """An email: `to` (one address or several), a `subject`, and `text` or `html` or both.

    `from_` is the payload's `from`; without it the relay's `email.from`.
    """

    to: str | Sequence[str]
    subject: str
    text: str | None = None
    html: str | None = None
    from_: str | None = None
    cc: str | Sequence[str] | None = None
    bcc: str | Sequence[str] | None = None
    reply_to: str | None = None

    def __post_init__(self) -> None:
        if not _addresses("to", self.to):
            raise ValueError("email 'to' must name at least one address")
        _addresses("cc", self.cc)
        _addresses("bcc", self.bcc)
        _text("email", "subject", self.subject)
        for field in ("text", "html", "from_", "reply_to"):
            _text("email", field, getattr(self, field), optional=True)
        if self.text is None and self.html is None:
            raise ValueError("an email needs text or html (or both)")

    @property
    def kind(self) -> str:
        return "email"

    def payload(self) -> dict[str, JSON]:
        p: dict[str, JSON] = {}
        if self.from_ is not None:
            p["from"] = self.from_
        p["to"] = _addresses("to", self.to)
        if self.cc is not None:
            p["cc"] = _addresses("cc", self.cc)
        if self.bcc is not None:
            p["bcc"] = _addresses("bcc", self.bcc)
        if self.reply_to is not None:
            p["reply_to"] = self.reply_to
        p["subject"] = self.subject
        if self.text is not None:
            p["text"] = self.text
        if self.html is not None:
            p["html"] = self.html
        return p


@dataclass(frozen=True, kw_only=True)
class Charge:
    """A card payment: `amount` in minor units (an int: 1999 is 19.99), a lowercase
    ISO 4217 `currency` ("usd"), a `payment_method`, and optional `customer`,
    `description` and `metadata` (text to text)."""

    amount: int
    currency: str
    payment_method: str
    customer: str | None = None
    description: str | None = None
    metadata: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.amount, bool) or not isinstance(self.amount, int):
            raise TypeError(
                f"charge 'amount' must be an int of minor units, not {type(self.amount).__name__}"
            )
        _text("charge", "currency", self.currency)
        _text("charge", "payment_method", self.payment_method)
        _text("charge", "customer", self.customer, optional=True)
        _text("charge", "description", self.description, optional=True)
        _string_map("charge", "metadata", self.metadata)

    @property
    def kind(self) -> str:
        return "charge"

    def payload(self) -> dict[str, JSON]:
        p: dict[str, JSON] = {
            "amount": self.amount,
            "currency": self.currency,
            "payment_method": self.payment_method,
        }
        if self.customer is not None:
            p["customer"] = self.customer
        if self.description is not None:
            p["description"] = self.description
        if self.metadata is not None:
            p["metadata"] = _string_map("charge", "metadata", self.metadata)
        return p


@dataclass(frozen=True, kw_only=True)
class Nats:
    """A JetStream publish of `body` (any JSON) to `subject`, with `headers`."""

    subject: str
    body: JSON
    headers: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        _text("nats", "subject", self.subject)
        _string_map("nats", "headers", self.headers)

    @property
    def kind(self) -> str:
        return "nats"

    def payload(self) -> dict[str, JSON]:
        p: dict[str, JSON] = {"subject": self.subject, "body": self.body}
        if self.headers:
            p["headers"] = _string_map("nats", "headers", self.headers)
        return p


@dataclass(frozen=True, kw_only=True)
class Amqp:
    """An AMQP 0-9-1 publish of `body` (any JSON) to `exchange` ("" is the default
    exchange) with `routing_key`; header values are text, whole numbers or booleans."""

    exchange: str
    routing_key: str
    body: JSON
    headers: Mapping[str, str | int | bool] | None = None

    def __post_init__(self) -> None:
        _text("amqp", "exchange", self.exchange)
        _text("amqp", "routing_key", self.routing_key)
        self._headers()

    def _headers(self) -> dict[str, JSON]:
        out: dict[str, JSON] = {}
        for name, v in (self.headers or {}).items():
            if not isinstance(name, str) or not isinstance(v, str | int | bool):
                raise TypeError(f"amqp header {name!r} must be text, a whole number or a boolean")
            out[name] = v
        return out

    @property
    def kind(self) -> str:
        return "amqp"

    def payload(self) -> dict[str, JSON]:
        p: dict[str, JSON] = {
            "exchange": self.exchange,
            "routing_key": self.routing_key,
            "body": self.body,
        }
        if self.headers:
            p["headers"] = self._headers()
        return p


@dataclass(frozen=True, kw_only=True)
class Kafka:
    """A record produced to `topic`: `body` (any JSON) as its value, an optional
    `key` (else the intent's ordering key, if any), text `headers`, and an optional
    `partition` (else the producer's partitioner chooses)."""

    topic: str
    body: JSON
    key: str | None = None
    headers: Mapping[str, str] | None = None
    partition: int | None = None

    def __post_init__(self) -> None:
        _text("kafka", "topic", self.topic)
        _text("kafka", "key", self.key, optional=True)
        _string_map("kafka", "headers", self.headers)
        if self.partition is not None and (
            isinstance(self.partition, bool)
            or not isinstance(self.partition, int)
            or not 0 <= self.partition <= 2**31 - 1
        ):
            raise ValueError(
                "kafka 'partition' must be a whole number from 0 to 2147483647, "
                f"not {self.partition!r}"
            )

    @property
    def kind(self) -> str:
        return "kafka"

    def payload(self) -> dict[str, JSON]:
        p: dict[str, JSON] = {"topic": self.topic}
        if self.key is not None:
            p["key"] = self.key
        p["body"] = self.body
        if self.headers:
            p["headers"] = _string_map("kafka", "headers", self.headers)
        if self.partition is not None:
            p["partition"] = self.partition
        return p
