//! NATS JetStream: publish an event with a `Nats-Msg-Id` derived from the
//! intent key, so JetStream dedupes a redelivery within the stream's
//! duplicate window.
//!
//! - A PubAck is delivered, reference `<stream>:<seq>`; a PubAck with
//!   `duplicate: true` is delivered and replayed (no new message).
//! - No stream for the subject (no responders) or a connection that never
//!   took the request: transient. No responders from a server (or account)
//!   without JetStream at all is the server's failure, not the subject's:
//!   it counts towards the `nats` breaker.
//! - A JetStream refusal that would repeat (wrong expected stream or last
//!   message id, a message over the server's size): rejected.
//! - No PubAck after the request went out: ambiguous. Reconcile then looks
//!   for the message (the last one on the subject carrying our id); if it
//!   is not there, republishing under the same id is safe only inside the
//!   stream's `duplicate_window`, read from stream info: inside it the
//!   relay republishes at once, past it the intent is parked as
//!   `ambiguous`. It never republishes blind.

pub mod request;

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use async_nats::jetstream::context::PublishErrorKind;
use async_nats::HeaderMap;
use tokio::sync::OnceCell;

use crate::{AmbiguityPolicy, Delivery, Outcome, Provider, Reconciled, Secret, SpanShape};

/// NATS settings, validated by the relay's config loader. Credentials come
/// from the environment or files and are never logged.
#[derive(Debug, Clone)]
pub struct NatsConfig {
    /// `nats://host:port` (or `tls://`); several servers separated by commas.
    pub url: String,
    pub token: Option<Secret>,
    pub user: Option<String>,
    pub password: Option<Secret>,
    /// An NKey seed (`SU...`).
    pub nkey: Option<Secret>,
    /// A `.creds` file (JWT and NKey).
    pub credentials_file: Option<PathBuf>,
    /// Require TLS; `tls_ca_file` adds a root certificate.
    pub require_tls: bool,
    pub tls_ca_file: Option<PathBuf>,
    /// How long a publish waits for its PubAck (and a connect, a reconcile).
    pub timeout: Duration,
    /// What to do with an outcome nothing can settle: park by default.
    pub on_ambiguous: AmbiguityPolicy,
}

impl NatsConfig {
    /// Check what the provider would refuse, without connecting.
    pub fn check(&self) -> Result<(), crate::Error> {
        if self.url.trim().is_empty() {
            return Err(crate::Error::Config("nats.url is empty".into()));
        }
        for server in self.url.split(',') {
            let server = server.trim();
            let scheme_ok = ["nats://", "tls://"].iter().any(|s| server.starts_with(s));
            if !scheme_ok {
                return Err(crate::Error::Config(format!(
                    "nats.url {server:?} must start with nats:// or tls://"
                )));
            }
        }
        if self.user.is_some() != self.password.is_some() {
            return Err(crate::Error::Config(
                "nats: a user needs a password and a password a user".into(),
            ));
        }
        let ways = [
            self.token.is_some(),
            self.user.is_some(),
            self.nkey.is_some(),
            self.credentials_file.is_some(),
        ];
        if ways.iter().filter(|w| **w).count() > 1 {
            return Err(crate::Error::Config(
                "nats: give one of token, user and password, nkey, credentials_file".into(),
            ));
        }
        Ok(())
    }
}

pub struct NatsProvider {
    config: NatsConfig,
    /// The connection and its JetStream context, made once: a context has
    /// its own acker task and in-flight limit, so it is shared, not built
    /// per publish.
    conn: OnceCell<(async_nats::Client, async_nats::jetstream::Context)>,
}

impl NatsProvider {
    pub fn new(config: NatsConfig) -> Result<Self, crate::Error> {
        config.check()?;
        Ok(NatsProvider {
            config,
            conn: OnceCell::new(),
        })
    }

    /// The connection and its JetStream context, made on first use;
    /// async-nats reconnects by itself (with backoff) after that.
    async fn conn(&self) -> Result<&(async_nats::Client, async_nats::jetstream::Context), String> {
        self.conn
            .get_or_try_init(|| async {
                let mut options = match &self.config.credentials_file {
                    Some(path) => async_nats::ConnectOptions::with_credentials_file(path)
                        .await
                        .map_err(|e| format!("nats.credentials_file: {e}"))?,
                    None => async_nats::ConnectOptions::new(),
                };
                if let Some(token) = &self.config.token {
                    options = options.token(token.expose().to_string());
                }
                if let (Some(user), Some(password)) = (&self.config.user, &self.config.password) {
                    options =
                        options.user_and_password(user.clone(), password.expose().to_string());
                }
                if let Some(seed) = &self.config.nkey {
                    options = options.nkey(seed.expose().to_string());
                }
                if self.config.require_tls {
                    options = options.require_tls(true);
                }
                if let Some(ca) = &self.config.tls_ca_file {
                    options = options.add_root_certificates(ca.clone());
                }
                let options = options
                    .connection_timeout(self.config.timeout)
                    .request_timeout(Some(self.config.timeout))
                    .name("outbox-relay");
                let servers: Vec<&str> = self.config.url.split(',').map(str::trim).collect();
                let client = options
                    .connect(servers)
                    .await
                    // the error names the server, never a credential
                    .map_err(|e| format!("cannot connect to NATS at {}: {e}", self.config.url))?;
                let mut js = async_nats::jetstream::new(client.clone());
                js.set_timeout(self.config.timeout);
                Ok((client, js))
            })
            .await
    }
}

/// "the subject's stream" in reasons.
fn no_stream(subject: &str) -> String {
    format!("no JetStream stream takes subject {subject:?} (no responders)")
}

#[async_trait::async_trait]
impl Provider for NatsProvider {
    fn kind(&self) -> &'static str {
        "nats"
    }

    async fn deliver(&self, d: &Delivery<'_>) -> Outcome {
        if let Err(reason) = crate::refuse_destination("nats", d.destination) {
            return Outcome::invalid(reason);
        }
        let mut publish = match request::parse(d.payload, d.raw_body()) {
            Ok(p) => p,
            Err(reason) => return Outcome::invalid(reason),
        };
        if let Some(trace) = d.trace {
            crate::span::set_trace_headers(&mut publish.headers, trace, |v| v.to_string());
        }
        // every wait of the attempt ends by its deadline: before the
        // publish is handed over nothing was sent (transient), after it the
        // stream may have stored it (ambiguous)
        let limit = d.time_left(self.config.timeout);
        let deadline = tokio::time::Instant::now() + limit;
        let connected = tokio::time::timeout_at(deadline, self.conn())
            .await
            .unwrap_or_else(|_| {
                Err(format!(
                    "no connection to NATS at {} within {limit:?}; nothing was sent",
                    self.config.url
                ))
            });
        let (client, js) = match connected {
            Ok(c) => c,
            Err(reason) => {
                return Outcome::Transient {
                    reason,
                    status: None,
                    retry_after: None,
                }
            }
        };
        let id = request::message_id(d.key, d.key_generation);
        let mut headers = HeaderMap::new();
        for (name, value) in &publish.headers {
            headers.insert(name.as_str(), value.as_str());
        }
        headers.insert(async_nats::header::NATS_MESSAGE_ID, id.as_str());
        let size = publish.body.len()
            + publish
                .headers
                .iter()
                .map(|(k, v)| k.len() + v.len() + 4)
                .sum::<usize>()
            + id.len()
            + 64;
        let max = client.server_info().max_payload;
        if max > 0 && size > max {
            return Outcome::invalid(format!(
                "the message is about {size} bytes; the NATS server takes at most {max}"
            ));
        }
        let subject = publish.subject.clone();
        let unconfirmed = || {
            Outcome::Ambiguous {
            reason: format!(
                "no PubAck for the publish to {subject:?} within {limit:?}; whether the stream stored it is unknown"
            ),
            status: None,
        }
        };
        let sent = tokio::time::timeout_at(
            deadline,
            js.publish_with_headers(subject.clone(), headers, publish.body.into()),
        )
        .await;
        let Ok(sent) = sent else {
            // handed to the client, which may still send it
            return unconfirmed();
        };
        let ack = match sent {
            Ok(ack) => match tokio::time::timeout_at(deadline, ack).await {
                Ok(ack) => ack,
                Err(_) => return unconfirmed(),
            },
            Err(e) => {
                return match e.kind() {
                    // not handed to the connection: nothing went out
                    PublishErrorKind::BrokenPipe | PublishErrorKind::MaxAckPending => {
                        Outcome::Transient {
                            reason: format!("NATS publish to {subject:?} not sent: {e}"),
                            status: None,
                            retry_after: None,
                        }
                    }
                    // queued while disconnected: it may still go out later
                    _ => Outcome::Ambiguous {
                        reason: format!(
                            "NATS publish to {subject:?} was not confirmed ({e}); it may go out after a reconnect"
                        ),
                        status: None,
                    },
                };
            }
        };
        match ack {
            Ok(ack) => Outcome::Delivered {
                reference: Some(format!("{}:{}", ack.stream, ack.sequence)),
                replayed: ack.duplicate,
                status: None,
            },
            Err(e) => match e.kind() {
                // the server answered: about this subject, not the server
                PublishErrorKind::StreamNotFound => match without_jetstream(js, deadline).await {
                    // nothing answers for any subject: the server's failure
                    Some(why) => Outcome::Transient {
                        reason: format!(
                            "the NATS server at {} has no JetStream ({why}); nothing was stored for {subject:?}",
                            self.config.url
                        ),
                        status: None,
                        retry_after: None,
                    },
                    None => Outcome::TargetUnavailable {
                        reason: no_stream(&subject),
                        status: None,
                    },
                },
                PublishErrorKind::WrongLastMessageId | PublishErrorKind::WrongLastSequence => {
                    Outcome::Rejected {
                        reason: format!("JetStream refused the publish to {subject:?}: {e}"),
                        status: None,
                        response: None,
                    }
                }
                PublishErrorKind::Other if jetstream_refusal(&e) => Outcome::Rejected {
                    reason: format!(
                        "JetStream refused the publish to {subject:?}: {}",
                        source_text(&e)
                    ),
                    status: None,
                    response: None,
                },
                _ => Outcome::Ambiguous {
                    reason: format!(
                        "no PubAck for the publish to {subject:?} within {limit:?} ({e}); whether the stream stored it is unknown"
                    ),
                    status: None,
                },
            },
        }
    }

    /// Is the message in its stream (the last one on the subject carrying
    /// our id)? If not: inside the duplicate window a republish under the
    /// same id is deduped ([`Reconciled::Deduped`]); past it, unknown.
    async fn reconcile(&self, d: &Delivery<'_>) -> Reconciled {
        let limit = d.time_left(self.config.timeout);
        tokio::time::timeout(limit, self.look_for(d))
            .await
            .unwrap_or(Reconciled::Unknown)
    }

    fn on_ambiguous(&self) -> AmbiguityPolicy {
        self.config.on_ambiguous
    }

    /// A messaging `publish` span on the intent's subject.
    fn span_shape(&self, d: &Delivery<'_>) -> SpanShape {
        match d.payload.get("subject").and_then(|s| s.as_str()) {
            Some(subject) => crate::span::publish(
                "nats",
                subject,
                request::message_id(d.key, d.key_generation),
            ),
            None => SpanShape::plain("nats"),
        }
    }
}

impl NatsProvider {
    /// [`Provider::reconcile`] without its time limit.
    async fn look_for(&self, d: &Delivery<'_>) -> Reconciled {
        let Ok(publish) = request::parse(d.payload, None) else {
            return Reconciled::Unknown;
        };
        let Ok((_, js)) = self.conn().await else {
            return Reconciled::Unknown;
        };
        let Ok(name) = js.stream_by_subject(publish.subject.clone()).await else {
            return Reconciled::Unknown;
        };
        let Ok(mut stream) = js.get_stream(&name).await else {
            return Reconciled::Unknown;
        };
        let id = request::message_id(d.key, d.key_generation);
        if let Ok(last) = stream
            .get_last_raw_message_by_subject(&publish.subject)
            .await
        {
            // by the header's constant: a name given as text is another key
            let ours = last.headers.get(async_nats::header::NATS_MESSAGE_ID);
            if ours.map(|v| v.as_str()) == Some(id.as_str()) {
                return Reconciled::Found {
                    reference: format!("{name}:{}", last.sequence),
                };
            }
        }
        let Ok(info) = stream.info().await else {
            return Reconciled::Unknown;
        };
        let window = info.config.duplicate_window;
        let since = d
            .previous_attempt_at
            .and_then(|t| SystemTime::now().duration_since(t).ok())
            .unwrap_or_default();
        // a margin for the republish itself to arrive inside the window
        if since + self.config.timeout + Duration::from_secs(1) < window {
            Reconciled::Deduped
        } else {
            Reconciled::Unknown
        }
    }
}

/// After no responders: does the server have no JetStream for this account
/// (its API does not answer, or answers that it is not enabled)? Says how;
/// `None` when JetStream answers, or the question gets no answer in time.
async fn without_jetstream(
    js: &async_nats::jetstream::Context,
    deadline: tokio::time::Instant,
) -> Option<String> {
    use async_nats::jetstream::context::AccountErrorKind;
    use async_nats::jetstream::ErrorCode;
    let Ok(answer) = tokio::time::timeout_at(deadline, js.query_account()).await else {
        return None;
    };
    let e = answer.err()?;
    match e.kind() {
        AccountErrorKind::JetStreamUnavailable => {
            Some("its JetStream API has no responders".into())
        }
        AccountErrorKind::JetStream(api)
            if matches!(
                api.error_code(),
                ErrorCode::JETSTREAM_NOT_ENABLED | ErrorCode::JETSTREAM_NOT_ENABLED_FOR_ACCOUNT
            ) =>
        {
            Some(format!("JetStream: {api}"))
        }
        _ => None,
    }
}

/// The ack was a JetStream API error (the server answered and refused).
fn jetstream_refusal(e: &async_nats::jetstream::context::PublishError) -> bool {
    std::error::Error::source(e)
        .is_some_and(|s| s.downcast_ref::<async_nats::jetstream::Error>().is_some())
}

fn source_text(e: &async_nats::jetstream::context::PublishError) -> String {
    std::error::Error::source(e)
        .map(|s| s.to_string())
        .unwrap_or_else(|| e.to_string())
}
