//! A small pooled SMTP client on lettre's connection API, with each step's
//! failure classified by how far the transaction got.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use lettre::transport::smtp::authentication::{Credentials, Mechanism};
use lettre::transport::smtp::client::{AsyncSmtpConnection, TlsParameters};
use lettre::transport::smtp::commands::{Data, Mail, Rcpt};
use lettre::transport::smtp::extension::{ClientId, Extension, MailBodyParameter, MailParameter};
use lettre::transport::smtp::response::Response;
use lettre::transport::smtp::Error as SmtpError;
use serde_json::json;

use super::message::Prepared;
use super::EmailConfig;
use crate::Outcome;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Security {
    /// `smtp://`: no TLS (a local relay).
    Plain,
    /// `smtp+starttls://`: upgrade with STARTTLS, refuse to continue without it.
    StartTls,
    /// `smtps://`: TLS from the first byte.
    Tls,
}

/// Where to send, parsed from `smtp_url`.
#[derive(Clone, PartialEq, Eq)]
pub struct SmtpTarget {
    pub security: Security,
    pub host: String,
    pub port: u16,
    pub username: Option<String>,
    pub password: Option<crate::Secret>,
}

impl std::fmt::Debug for SmtpTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "SmtpTarget({:?} {}:{})",
            self.security, self.host, self.port
        )
    }
}

impl SmtpTarget {
    /// `smtp://host[:25]`, `smtp+starttls://host[:587]`, `smtps://host[:465]`,
    /// optionally with `user:password@`. Errors never echo the password.
    pub fn parse(text: &str) -> Result<SmtpTarget, String> {
        let url = url::Url::parse(text).map_err(|e| format!("email.smtp_url is not a URL: {e}"))?;
        let (security, default_port) = match url.scheme() {
            "smtp" => (Security::Plain, 25),
            "smtp+starttls" => (Security::StartTls, 587),
            "smtps" => (Security::Tls, 465),
            other => {
                return Err(format!(
                    "email.smtp_url scheme {other:?} is not supported (use smtp, smtp+starttls or smtps)"
                ))
            }
        };
        let host = url
            .host_str()
            .filter(|h| !h.is_empty())
            .ok_or("email.smtp_url has no host")?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let decode = |s: &str| percent_decode(s);
        Ok(SmtpTarget {
            security,
            host,
            port: url.port().unwrap_or(default_port),
            username: (!url.username().is_empty()).then(|| decode(url.username())),
            password: url.password().map(|p| crate::Secret::new(decode(p))),
        })
    }
}

fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

/// Why a send failed before any reply could be classified.
enum SendError {
    /// Connecting, TLS or authentication failed: nothing was sent.
    Setup(String),
    Smtp(SmtpError),
}

pub struct Client {
    target: SmtpTarget,
    credentials: Option<Credentials>,
    hello: ClientId,
    connect_timeout: Duration,
    pool_size: usize,
    idle: Mutex<Vec<AsyncSmtpConnection>>,
}

/// The SMTP credentials `config` names, refused when incomplete or when
/// they would cross the network in the clear.
pub fn credentials(config: &EmailConfig) -> Result<Option<Credentials>, String> {
    let username = config.target.username.clone().or(config.username.clone());
    let password = config.target.password.clone().or(config.password.clone());
    let credentials = match (username, password) {
        (Some(u), Some(p)) => Some(Credentials::new(u, p.expose().to_string())),
        (None, None) => None,
        _ => return Err("email: a username needs a password and a password a username".into()),
    };
    if credentials.is_some()
        && config.target.security == Security::Plain
        && !is_loopback(&config.target.host)
    {
        return Err("email: refusing to send SMTP credentials without TLS to a non-local server; use smtp+starttls:// or smtps://".into());
    }
    Ok(credentials)
}

impl Client {
    pub fn new(config: &EmailConfig) -> Result<Client, String> {
        let credentials = credentials(config)?;
        let hello = match &config.hello_name {
            Some(name) => ClientId::Domain(name.clone()),
            None => ClientId::Domain(
                std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .map(|h| h.trim().to_string())
                    .ok()
                    .filter(|h| !h.is_empty())
                    .unwrap_or_else(|| "localhost".into()),
            ),
        };
        Ok(Client {
            target: config.target.clone(),
            credentials,
            hello,
            connect_timeout: config.connect_timeout,
            pool_size: config.pool_size,
            idle: Mutex::new(Vec::new()),
        })
    }

    /// Send one message, bounded by `limit` (the whole-send timeout, cut to
    /// the attempt's deadline).
    pub async fn send(&self, msg: &Prepared, limit: Duration) -> Outcome {
        let body_sent = AtomicBool::new(false);
        let attempt = async {
            // A pooled connection may have been closed by the server while
            // idle; if it fails before the body, try once on a fresh one.
            if let Some(mut conn) = self.take_idle() {
                match transaction(&mut conn, msg, &body_sent).await {
                    Ok(reply) => return Ok((reply, conn)),
                    Err(e) if !body_sent.load(Ordering::SeqCst) && e.status().is_none() => {
                        conn.abort().await;
                    }
                    Err(e) => {
                        conn.abort().await;
                        return Err(SendError::Smtp(e));
                    }
                }
            }
            let mut conn = self.connect().await.map_err(SendError::Setup)?;
            match transaction(&mut conn, msg, &body_sent).await {
                Ok(reply) => Ok((reply, conn)),
                Err(e) => {
                    conn.abort().await;
                    Err(SendError::Smtp(e))
                }
            }
        };
        match tokio::time::timeout(limit, attempt).await {
            Ok(Ok((reply, conn))) => {
                self.put_idle(conn);
                delivered(&reply, &msg.message_id)
            }
            Ok(Err(SendError::Smtp(err))) => classify(&err, body_sent.load(Ordering::SeqCst)),
            Ok(Err(SendError::Setup(reason))) => Outcome::Transient {
                reason,
                status: None,
                retry_after: None,
            },
            Err(_) => {
                let secs = limit.as_secs_f64();
                if body_sent.load(Ordering::SeqCst) {
                    Outcome::Ambiguous {
                        reason: format!("SMTP server did not confirm the message within {secs}s after the body was sent"),
                        status: None,
                    }
                } else {
                    Outcome::Transient {
                        reason: format!(
                            "SMTP send timed out after {secs}s before the body was sent"
                        ),
                        status: None,
                        retry_after: None,
                    }
                }
            }
        }
    }

    /// Connect, upgrade, authenticate. The error text names the server, never
    /// the credentials.
    async fn connect(&self) -> Result<AsyncSmtpConnection, String> {
        let t = &self.target;
        let at = format!("{}:{}", t.host, t.port);
        let tls = |host: &str| {
            TlsParameters::new(host.to_string())
                .map_err(|e| format!("SMTP TLS setup for {at}: {e}"))
        };
        let implicit = match t.security {
            Security::Tls => Some(tls(&t.host)?),
            _ => None,
        };
        let mut conn = AsyncSmtpConnection::connect_tokio1(
            (t.host.as_str(), t.port),
            Some(self.connect_timeout),
            &self.hello,
            implicit,
            None,
        )
        .await
        .map_err(|e| format!("cannot connect to the SMTP server at {at}: {e}"))?;
        if t.security == Security::StartTls {
            if !conn.can_starttls() {
                conn.abort().await;
                return Err(format!("the SMTP server at {at} does not offer STARTTLS"));
            }
            conn.starttls(tls(&t.host)?, &self.hello)
                .await
                .map_err(|e| format!("STARTTLS with {at} failed: {e}"))?;
        }
        if let Some(creds) = &self.credentials {
            if let Err(e) = conn
                .auth(&[Mechanism::Plain, Mechanism::Login], creds)
                .await
            {
                conn.abort().await;
                return Err(format!("SMTP authentication at {at} failed: {e}"));
            }
        }
        Ok(conn)
    }

    fn take_idle(&self) -> Option<AsyncSmtpConnection> {
        self.idle.lock().ok()?.pop()
    }

    fn put_idle(&self, conn: AsyncSmtpConnection) {
        if conn.has_broken() {
            return;
        }
        if let Ok(mut idle) = self.idle.lock() {
            if idle.len() < self.pool_size {
                idle.push(conn);
            }
        }
    }
}

fn is_loopback(host: &str) -> bool {
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// MAIL, RCPT..., DATA, body. `body_sent` turns true once the body is handed
/// to the server: from then on a failure is ambiguous.
async fn transaction(
    conn: &mut AsyncSmtpConnection,
    msg: &Prepared,
    body_sent: &AtomicBool,
) -> Result<Response, SmtpError> {
    let params = if conn.server_info().supports_feature(Extension::EightBitMime) {
        vec![MailParameter::Body(MailBodyParameter::EightBitMime)]
    } else {
        vec![]
    };
    conn.command(Mail::new(msg.envelope.from().cloned(), params))
        .await?;
    for rcpt in msg.envelope.to() {
        conn.command(Rcpt::new(rcpt.clone(), vec![])).await?;
    }
    conn.command(Data).await?;
    body_sent.store(true, Ordering::SeqCst);
    conn.message(&msg.bytes).await
}

fn reply_text(resp: &Response) -> String {
    resp.message().collect::<Vec<_>>().join(" ")
}

/// The queue id from "250 2.0.0 Ok: queued as ABC123", else the reply line.
pub fn queue_reference(reply_line: &str) -> String {
    let lower = reply_line.to_ascii_lowercase();
    match lower.find("queued as ") {
        Some(i) => reply_line[i + "queued as ".len()..]
            .split_whitespace()
            .next()
            .unwrap_or(reply_line)
            .trim_matches(|c: char| !c.is_ascii_alphanumeric())
            .to_string(),
        None => reply_line.trim().to_string(),
    }
}

fn delivered(reply: &Response, message_id: &str) -> Outcome {
    let code = u16::from(reply.code());
    Outcome::Delivered {
        reference: Some(format!(
            "{} {message_id}",
            queue_reference(&reply_text(reply))
        )),
        replayed: false,
        status: Some(code),
    }
}

/// 4yz → transient; 5yz → rejected with the reply; a failure without a reply
/// → transient before the body was sent, ambiguous after.
pub fn classify(err: &SmtpError, body_sent: bool) -> Outcome {
    let text = err.to_string();
    match err.status().map(u16::from) {
        Some(code) if (500..600).contains(&code) => Outcome::Rejected {
            reason: format!("SMTP server refused the message: {text}"),
            status: Some(code),
            response: Some(json!({"code": code, "reply": text})),
        },
        Some(code) => Outcome::Transient {
            reason: format!("SMTP server deferred the message: {text}"),
            status: Some(code),
            retry_after: None,
        },
        None if body_sent => Outcome::Ambiguous {
            reason: format!("SMTP connection failed after the message body was sent: {text}"),
            status: None,
        },
        None => Outcome::Transient {
            reason: format!("SMTP failed before the message body was sent: {text}"),
            status: None,
            retry_after: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_smtp_urls() {
        let t = SmtpTarget::parse("smtp://127.0.0.1:2525").unwrap();
        assert_eq!(
            (t.security, t.host.as_str(), t.port),
            (Security::Plain, "127.0.0.1", 2525)
        );
        let t = SmtpTarget::parse("smtp+starttls://mail.example.com").unwrap();
        assert_eq!((t.security, t.port), (Security::StartTls, 587));
        let t = SmtpTarget::parse("smtps://u%40x:p%2Fw@mail.example.com").unwrap();
        assert_eq!((t.security, t.port), (Security::Tls, 465));
        assert_eq!(t.username.as_deref(), Some("u@x"));
        assert_eq!(t.password.unwrap().expose(), "p/w");
        let err = SmtpTarget::parse("http://user:hunter2@mail.example.com").unwrap_err();
        assert!(
            err.contains("not supported") && !err.contains("hunter2"),
            "{err}"
        );
        assert!(
            !format!("{:?}", SmtpTarget::parse("smtps://u:hunter2@h").unwrap()).contains("hunter2")
        );
    }

    #[test]
    fn queue_ids_are_parsed_from_the_reply() {
        assert_eq!(
            queue_reference("2.0.0 Ok: queued as 4Xk2Q81zG9z"),
            "4Xk2Q81zG9z"
        );
        assert_eq!(queue_reference("OK Queued as <ABC-1>"), "ABC-1");
        assert_eq!(
            queue_reference("2.0.0 OK 1700000000 x12si"),
            "2.0.0 OK 1700000000 x12si"
        );
    }
}
