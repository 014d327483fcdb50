//! A webhook to an HTTPS receiver speaks TLS and verifies the receiver's
//! certificate against Mozilla's roots: a self-signed receiver is refused
//! during the handshake, before a byte of the request is written, so the
//! attempt is transient ("nothing was sent") and names the certificate.
//!
//! The receiver is a rustls server on loopback with a certificate made by
//! `openssl` (Debian's `openssl` package) under the target directory.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::delivery;
use outbox_providers::webhook::{WebhookConfig, WebhookProvider};
use outbox_providers::Provider;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::json;
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

mod common;

/// A self-signed certificate for 127.0.0.1 and its key, as PEM files.
fn self_signed() -> (PathBuf, PathBuf) {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("webhook-tls");
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = (dir.join("server.crt"), dir.join("server.key"));
    let made = Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args([
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ])
        .args(["-addext", "basicConstraints=critical,CA:FALSE"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl makes the receiver's certificate (apt-get install openssl)");
    assert!(made.status.success(), "{made:?}");
    (cert, key)
}

/// An HTTPS receiver; each connection reports how its handshake ended and
/// how many bytes of a request it then read.
async fn receiver(cert: PathBuf, key: PathBuf) -> (u16, mpsc::UnboundedReceiver<String>) {
    let certs = CertificateDer::pem_file_iter(cert)
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(key).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            let report = match acceptor.accept(conn).await {
                Err(e) => format!("handshake failed: {e}"),
                Ok(mut tls) => {
                    let mut request = vec![0u8; 4096];
                    let n = tls.read(&mut request).await.unwrap_or(0);
                    format!("handshake done, {n} request bytes read")
                }
            };
            let _ = tx.send(report);
        }
    });
    (port, rx)
}

#[tokio::test]
async fn a_receiver_whose_certificate_is_not_trusted_is_sent_nothing() {
    let (cert, key) = self_signed();
    let (port, mut reports) = receiver(cert, key).await;
    let provider = WebhookProvider::new(WebhookConfig {
        timeout: Duration::from_secs(10),
        connect_timeout: Duration::from_secs(5),
        allowed_networks: vec!["127.0.0.0/8".parse().unwrap()],
        ..Default::default()
    })
    .unwrap();
    let payload = json!({"url": format!("https://127.0.0.1:{port}/hook"), "body": {"n": 1}});
    let out = provider.deliver(&delivery("webhook", &payload, None)).await;
    assert_eq!(out.class(), "transient", "{out:?}");
    let reason = out.reason().unwrap();
    assert!(reason.contains("nothing was sent"), "{reason}");
    assert!(
        reason.contains("invalid peer certificate: UnknownIssuer"),
        "{reason}"
    );
    // the receiver saw a handshake, and the relay ended it
    let report = tokio::time::timeout(Duration::from_secs(5), reports.recv())
        .await
        .expect("the receiver reports its connection")
        .unwrap();
    assert!(report.starts_with("handshake failed"), "{report}");
}
