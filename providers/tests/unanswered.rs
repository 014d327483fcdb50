//! Which side of "may have reached the provider" each failure is on, against
//! real sockets on loopback: a port nobody listens on (nothing can have been
//! sent: transient), a peer that takes the request and never answers (a
//! timeout is an absence of information: ambiguous), a peer that reads the
//! request and hangs up (ambiguous), and for SMTP a peer that goes silent
//! before the body (transient) or after it (ambiguous). The provider's own
//! timer decides, cut to the attempt's deadline when that comes first.

use std::time::{Duration, Instant};

use common::delivery;
use outbox_providers::charge::{ChargeConfig, ChargeProvider};
use outbox_providers::email::{EmailConfig, EmailProvider, SmtpTarget};
use outbox_providers::webhook::{WebhookConfig, WebhookProvider};
use outbox_providers::{AmbiguityPolicy, Outcome, Provider, Secret};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

mod common;

/// What a scripted peer does with each connection.
#[derive(Clone, Copy)]
enum Peer {
    /// Reads what it is sent and never answers.
    Silent,
    /// Reads the request's first bytes, then closes the connection.
    HangsUp,
    /// An SMTP server that answers up to `DATA` and goes silent, either
    /// before the body arrives or after the body's final dot.
    SmtpSilent { after_body: bool },
}

/// A port that refuses connections (its listener is gone).
fn refused_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn start(peer: Peer) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((conn, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(serve(conn, peer));
        }
    });
    port
}

async fn serve(mut conn: TcpStream, peer: Peer) {
    match peer {
        Peer::Silent => {
            let mut sink = Vec::new();
            let _ = conn.read_to_end(&mut sink).await;
        }
        Peer::HangsUp => {
            let mut first = [0u8; 64];
            let _ = conn.read(&mut first).await;
        }
        Peer::SmtpSilent { after_body } => {
            let (read, mut write) = conn.split();
            let mut lines = BufReader::new(read).lines();
            let _ = write.write_all(b"220 test ESMTP\r\n").await;
            let mut in_body = false;
            while let Ok(Some(line)) = lines.next_line().await {
                if in_body {
                    if line == "." {
                        // the whole message arrived: never confirm it
                        let _ = lines.next_line().await;
                        return;
                    }
                    continue;
                }
                let verb = line.get(..4).unwrap_or("").to_ascii_uppercase();
                let reply: &[u8] = match verb.as_str() {
                    "EHLO" | "HELO" => b"250 test\r\n",
                    "DATA" if !after_body => {
                        // silent from here: the body is never asked for
                        let _ = lines.next_line().await;
                        return;
                    }
                    "DATA" => {
                        in_body = true;
                        b"354 go ahead\r\n"
                    }
                    "QUIT" => return,
                    _ => b"250 ok\r\n",
                };
                let _ = write.write_all(reply).await;
            }
        }
    }
}

fn webhook(timeout: Duration) -> WebhookProvider {
    WebhookProvider::new(WebhookConfig {
        timeout,
        connect_timeout: Duration::from_millis(500),
        allowed_networks: vec!["127.0.0.0/8".parse().unwrap()],
        on_ambiguous: AmbiguityPolicy::Park,
        ..Default::default()
    })
    .unwrap()
}

fn charge(port: u16) -> ChargeProvider {
    ChargeProvider::new(ChargeConfig {
        api_base: format!("http://127.0.0.1:{port}").parse().unwrap(),
        api_key: Secret::new("sk_test_unanswered"),
        timeout: Duration::from_millis(400),
        connect_timeout: Duration::from_millis(300),
        reconcile_timeout: Duration::from_millis(300),
        on_ambiguous: AmbiguityPolicy::Park,
    })
    .unwrap()
}

fn email(port: u16) -> EmailProvider {
    let mut config =
        EmailConfig::new(SmtpTarget::parse(&format!("smtp://127.0.0.1:{port}")).unwrap());
    config.timeout = Duration::from_millis(600);
    config.connect_timeout = Duration::from_millis(300);
    config.hello_name = Some("relay.test".into());
    EmailProvider::new(config).unwrap()
}

fn class(outcome: &Outcome) -> &'static str {
    outcome.class()
}

#[tokio::test]
async fn webhook_nothing_sent_is_transient_and_a_request_without_an_answer_is_ambiguous() {
    let p = webhook(Duration::from_millis(400));
    let refused = json!({"url": format!("http://127.0.0.1:{}/", refused_port()), "body": 1});
    let out = p.deliver(&delivery("webhook", &refused, None)).await;
    assert_eq!(class(&out), "transient", "{out:?}");
    assert!(
        out.reason().unwrap().contains("nothing was sent"),
        "{out:?}"
    );

    let silent =
        json!({"url": format!("http://127.0.0.1:{}/", start(Peer::Silent).await), "body": 1});
    let out = p.deliver(&delivery("webhook", &silent, None)).await;
    assert_eq!(class(&out), "ambiguous", "{out:?}");
    assert!(
        out.reason().unwrap().contains("no answer within 400ms"),
        "{out:?}"
    );

    let hangs_up =
        json!({"url": format!("http://127.0.0.1:{}/", start(Peer::HangsUp).await), "body": 1});
    let out = p.deliver(&delivery("webhook", &hangs_up, None)).await;
    assert_eq!(class(&out), "ambiguous", "{out:?}");
}

/// The connect timeout covers the TLS handshake: a peer that takes the
/// connection and never answers the ClientHello has been sent nothing.
#[tokio::test]
async fn webhook_a_tls_handshake_without_an_answer_is_transient() {
    let p = webhook(Duration::from_secs(10));
    let silent =
        json!({"url": format!("https://127.0.0.1:{}/", start(Peer::Silent).await), "body": 1});
    let began = Instant::now();
    let out = p.deliver(&delivery("webhook", &silent, None)).await;
    let took = began.elapsed();
    assert_eq!(class(&out), "transient", "{out:?}");
    let reason = out.reason().unwrap();
    assert!(reason.contains("nothing was sent"), "{reason}");
    assert!(reason.contains("connect timed out after 500ms"), "{reason}");
    assert!(
        took >= Duration::from_millis(490) && took < Duration::from_secs(5),
        "answered after {took:?}, not at the connect timeout"
    );
}

#[tokio::test]
async fn webhook_timeout_is_cut_to_the_attempts_deadline() {
    let p = webhook(Duration::from_secs(30));
    let silent =
        json!({"url": format!("http://127.0.0.1:{}/", start(Peer::Silent).await), "body": 1});
    let began = Instant::now();
    let deadline = began + Duration::from_millis(300);
    let out = p
        .deliver(&delivery("webhook", &silent, Some(deadline)))
        .await;
    let took = began.elapsed();
    assert_eq!(class(&out), "ambiguous", "{out:?}");
    assert!(
        took >= Duration::from_millis(290) && took < Duration::from_secs(5),
        "answered after {took:?}, not at the deadline"
    );
}

#[tokio::test]
async fn charge_nothing_sent_is_transient_and_a_post_without_an_answer_is_ambiguous() {
    let payload = json!({"amount": 100, "currency": "usd", "payment_method": "pm_card_visa"});
    let out = charge(refused_port())
        .deliver(&delivery("charge", &payload, None))
        .await;
    assert_eq!(class(&out), "transient", "{out:?}");
    let out = charge(start(Peer::Silent).await)
        .deliver(&delivery("charge", &payload, None))
        .await;
    assert_eq!(class(&out), "ambiguous", "{out:?}");
    let out = charge(start(Peer::HangsUp).await)
        .deliver(&delivery("charge", &payload, None))
        .await;
    assert_eq!(class(&out), "ambiguous", "{out:?}");
}

#[tokio::test]
async fn smtp_silence_before_the_body_is_transient_and_after_it_ambiguous() {
    let payload = json!({"from": "shop@example.com", "to": ["a@example.com"],
                         "subject": "s", "text": "t"});
    let out = email(refused_port())
        .deliver(&delivery("email", &payload, None))
        .await;
    assert_eq!(class(&out), "transient", "{out:?}");
    let out = email(start(Peer::SmtpSilent { after_body: false }).await)
        .deliver(&delivery("email", &payload, None))
        .await;
    assert_eq!(class(&out), "transient", "{out:?}");
    assert!(out.reason().unwrap().contains("before the body"), "{out:?}");
    let out = email(start(Peer::SmtpSilent { after_body: true }).await)
        .deliver(&delivery("email", &payload, None))
        .await;
    assert_eq!(class(&out), "ambiguous", "{out:?}");
}
