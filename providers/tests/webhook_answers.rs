//! How the webhook's HTTP client reads an answer, against scripted
//! receivers on loopback: a 2xx whose body never finishes is delivered at
//! the attempt's timeout (the receiver has answered), a refusal keeps at
//! most `max_response_bytes` of its body, and an IPv6 literal URL is
//! connected to like any other.

use std::time::{Duration, Instant};

use common::delivery;
use outbox_providers::webhook::{WebhookConfig, WebhookProvider};
use outbox_providers::{Outcome, Provider};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

mod common;

/// A receiver on `addr` that reads each request's head and body, writes
/// `answer`, and keeps the connection open without another byte.
async fn receiver(addr: &str, answer: &'static [u8]) -> String {
    let listener = TcpListener::bind(addr)
        .await
        .unwrap_or_else(|e| panic!("a receiver on {addr} (loopback, IPv4 or IPv6): {e}"));
    let local = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            tokio::spawn(answer_once(conn, answer));
        }
    });
    match local {
        std::net::SocketAddr::V4(a) => format!("http://{a}/hook"),
        std::net::SocketAddr::V6(a) => format!("http://[{}]:{}/hook", a.ip(), a.port()),
    }
}

async fn answer_once(mut conn: TcpStream, answer: &'static [u8]) {
    let mut request = Vec::new();
    let mut buf = [0u8; 4096];
    // the head, then as much body as its content-length says
    loop {
        let Ok(n) = conn.read(&mut buf).await else {
            return;
        };
        if n == 0 {
            return;
        }
        request.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&request).to_ascii_lowercase();
        if let Some(end) = text.find("\r\n\r\n") {
            let length = text[..end]
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            if request.len() >= end + 4 + length {
                break;
            }
        }
    }
    let _ = conn.write_all(answer).await;
    tokio::time::sleep(Duration::from_secs(30)).await;
}

fn provider(timeout: Duration, allowed: &str, max_response_bytes: usize) -> WebhookProvider {
    WebhookProvider::new(WebhookConfig {
        timeout,
        connect_timeout: Duration::from_secs(2),
        allowed_networks: vec![allowed.parse().unwrap()],
        max_response_bytes,
        ..Default::default()
    })
    .unwrap()
}

async fn deliver(p: &WebhookProvider, payload: &Value) -> Outcome {
    p.deliver(&delivery("webhook", payload, None)).await
}

#[tokio::test]
async fn a_2xx_whose_body_never_finishes_is_delivered_at_the_timeout() {
    let url = receiver(
        "127.0.0.1:0",
        b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nten bytes.",
    )
    .await;
    let p = provider(Duration::from_millis(500), "127.0.0.0/8", 4096);
    let began = Instant::now();
    let out = deliver(&p, &json!({"url": url, "body": 1})).await;
    let took = began.elapsed();
    assert!(
        matches!(
            out,
            Outcome::Delivered {
                status: Some(200),
                ..
            }
        ),
        "{out:?}"
    );
    assert!(
        took >= Duration::from_millis(450) && took < Duration::from_secs(5),
        "answered after {took:?}, not at the attempt's timeout"
    );
}

#[tokio::test]
async fn a_refusal_keeps_at_most_max_response_bytes_of_its_body() {
    let url = receiver(
        "127.0.0.1:0",
        b"HTTP/1.1 422 Unprocessable Entity\r\ncontent-length: 64\r\n\r\n\
          0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
    )
    .await;
    let p = provider(Duration::from_secs(5), "127.0.0.0/8", 20);
    let out = deliver(&p, &json!({"url": url, "body": 1})).await;
    let Outcome::Rejected {
        status, response, ..
    } = &out
    else {
        panic!("a 422 is a refusal: {out:?}");
    };
    assert_eq!(*status, Some(422));
    assert_eq!(
        response.as_ref().unwrap(),
        &json!({"status": 422, "body": "0123456789abcdef0123"})
    );
}

#[tokio::test]
async fn an_ipv6_literal_is_connected_to_like_any_other() {
    let url = receiver("[::1]:0", b"HTTP/1.1 204 No Content\r\n\r\n").await;
    assert!(url.starts_with("http://[::1]:"), "{url}");
    let p = provider(Duration::from_secs(5), "::1/128", 4096);
    let out = deliver(&p, &json!({"url": url, "body": {"n": 1}})).await;
    let Outcome::Delivered {
        reference, status, ..
    } = &out
    else {
        panic!("delivered over IPv6: {out:?}");
    };
    assert_eq!(*status, Some(204));
    assert!(reference.as_deref().unwrap().starts_with("msg_"), "{out:?}");
    // the guard still decides: without ::1 allowed, nothing is sent
    let guarded = provider(Duration::from_secs(5), "127.0.0.0/8", 4096);
    let out = deliver(&guarded, &json!({"url": url, "body": 1})).await;
    assert_eq!(out.class(), "rejected", "{out:?}");
}
