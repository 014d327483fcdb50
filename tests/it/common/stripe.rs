//! A faithful in-test fake of Stripe's PaymentIntents idempotency semantics:
//! the first response for a key is stored and replayed (500s included) with
//! `Idempotent-Replayed: true`; reuse with other parameters is a 400
//! idempotency_error; a request while the first is still executing is a 409;
//! search by metadata finds created intents.
//!
//! The payment method picks the behaviour: `pm_card_visa` succeeds,
//! `pm_card_chargeDeclined` is declined (402), `pm_500_after_create` creates
//! the payment and then answers 500, `pm_500_before_create` answers 500
//! without creating anything, `pm_slow` takes 1.5 s, `pm_decline_nul` is
//! declined with a NUL byte in its message, and `pm_rate_limited_absurdly`
//! is refused with 429 and `Retry-After: 99999999999999` before anything
//! is stored under the key (as the real API's rate limiter answers).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{json, Value};

pub const API_KEY: &str = "sk_test_fake_4eC39HqLyjWDarjtT1zdp7dc";

#[derive(Debug, Clone)]
enum Stored {
    InFlight(Vec<(String, String)>),
    Done {
        params: Vec<(String, String)>,
        status: u16,
        body: Value,
    },
}

#[derive(Default)]
struct Inner {
    keys: HashMap<String, Stored>,
    payments: Vec<Value>,
    /// Every request: (idempotency key, replayed?)
    log: Vec<(String, bool, u16)>,
    /// How long a search takes to answer.
    search_delay: std::time::Duration,
    /// Every authorized request: (path, traceparent, tracestate).
    traced: Vec<(String, Option<String>, Option<String>)>,
}

#[derive(Clone, Default)]
pub struct FakeStripe {
    inner: Arc<Mutex<Inner>>,
}

pub struct Running {
    pub fake: FakeStripe,
    pub base: String,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl FakeStripe {
    pub async fn start() -> Running {
        let fake = FakeStripe::default();
        let app = axum::Router::new()
            .route("/v1/payment_intents", post(create))
            .route("/v1/payment_intents/search", get(search))
            .with_state(fake.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Running { fake, base, server }
    }

    pub fn payments(&self) -> Vec<Value> {
        self.inner.lock().unwrap().payments.clone()
    }

    /// (Idempotency-Key, replayed, status) of every create request.
    pub fn requests(&self) -> Vec<(String, bool, u16)> {
        self.inner.lock().unwrap().log.clone()
    }

    /// (path, `traceparent`, `tracestate`) of every authorized request.
    pub fn trace_headers(&self) -> Vec<(String, Option<String>, Option<String>)> {
        self.inner.lock().unwrap().traced.clone()
    }

    /// Pretend another request under `key` is executing right now.
    pub fn hold(&self, key: &str) {
        self.inner
            .lock()
            .unwrap()
            .keys
            .insert(key.into(), Stored::InFlight(vec![]));
    }

    /// Make every search take `delay` (a slow reconcile).
    pub fn slow_search(&self, delay: std::time::Duration) {
        self.inner.lock().unwrap().search_delay = delay;
    }

    pub fn release(&self, key: &str) {
        self.inner.lock().unwrap().keys.remove(key);
    }
}

impl FakeStripe {
    fn note_trace(&self, path: &str, headers: &HeaderMap) {
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        self.inner.lock().unwrap().traced.push((
            path.to_string(),
            header("traceparent"),
            header("tracestate"),
        ));
    }
}

fn error(status: u16, kind: &str, code: Option<&str>, message: &str) -> (u16, Value) {
    (
        status,
        json!({"error": {"type": kind, "code": code, "message": message}}),
    )
}

async fn create(State(fake): State<FakeStripe>, headers: HeaderMap, body: Bytes) -> Response {
    if let Some(refused) = unauthorized(&headers) {
        return refused;
    }
    fake.note_trace("/v1/payment_intents", &headers);
    let params: Vec<(String, String)> = url::form_urlencoded::parse(&body).into_owned().collect();
    if params
        .iter()
        .any(|(k, v)| k == "payment_method" && v == "pm_rate_limited_absurdly")
    {
        let (s, b) = error(429, "rate_limit_error", None, "Too many requests");
        let mut resp = reply(s, b, false);
        resp.headers_mut()
            .insert("retry-after", "99999999999999".parse().unwrap());
        fake.inner.lock().unwrap().log.push((
            headers
                .get("idempotency-key")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string(),
            false,
            429,
        ));
        return resp;
    }
    let Some(key) = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
    else {
        let (s, b) = error(
            400,
            "invalid_request_error",
            None,
            "the fake requires an Idempotency-Key",
        );
        return reply(s, b, false);
    };
    {
        let mut inner = fake.inner.lock().unwrap();
        match inner.keys.get(&key).cloned() {
            Some(Stored::InFlight(_)) => {
                inner.log.push((key, false, 409));
                let (s, b) = error(
                    409,
                    "idempotency_error",
                    None,
                    "There is currently another in-progress request using this Idempotency-Key",
                );
                return reply(s, b, false);
            }
            Some(Stored::Done {
                params: first,
                status,
                body,
            }) => {
                if first != params {
                    inner.log.push((key, false, 400));
                    let (s, b) = error(400, "idempotency_error", None, "Keys for idempotent requests can only be used with the same parameters they were first used with");
                    return reply(s, b, false);
                }
                inner.log.push((key, true, status));
                return reply(status, body, true);
            }
            None => {
                inner
                    .keys
                    .insert(key.clone(), Stored::InFlight(params.clone()));
            }
        }
    }
    // Like the real API, a request runs to the end once it started, even
    // when the client goes away: its outcome is stored under the key.
    let (status, body) = tokio::spawn(execute(fake, key, params))
        .await
        .expect("the fake's request task");
    reply(status, body, false)
}

async fn search(
    State(fake): State<FakeStripe>,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
) -> Response {
    if let Some(refused) = unauthorized(&headers) {
        return refused;
    }
    fake.note_trace("/v1/payment_intents/search", &headers);
    let delay = fake.inner.lock().unwrap().search_delay;
    tokio::time::sleep(delay).await;
    let query = url::form_urlencoded::parse(q.unwrap_or_default().as_bytes())
        .find(|(k, _)| k == "query")
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default();
    // metadata['NAME']:'VALUE'
    let parsed = query
        .strip_prefix("metadata['")
        .and_then(|rest| rest.split_once("']:'"))
        .map(|(name, value)| (name.to_string(), value.trim_end_matches('\'').to_string()));
    let Some((name, value)) = parsed else {
        let (s, b) = error(
            400,
            "invalid_request_error",
            None,
            "unsupported search query",
        );
        return reply(s, b, false);
    };
    let data: Vec<Value> = fake
        .payments()
        .into_iter()
        .filter(|pi| pi["metadata"][&name] == value.as_str())
        .collect();
    reply(200, json!({"object": "search_result", "data": data}), false)
}

/// A 401 unless the request carries the fake's API key.
fn unauthorized(headers: &HeaderMap) -> Option<Response> {
    let expected = format!("Bearer {API_KEY}");
    if headers.get("authorization").and_then(|v| v.to_str().ok()) == Some(expected.as_str()) {
        return None;
    }
    let (s, b) = error(
        401,
        "invalid_request_error",
        None,
        "Invalid API Key provided",
    );
    Some(reply(s, b, false))
}

fn reply(status: u16, body: Value, replayed: bool) -> Response {
    let mut resp = (StatusCode::from_u16(status).unwrap(), axum::Json(body)).into_response();
    if replayed {
        resp.headers_mut()
            .insert("idempotent-replayed", "true".parse().unwrap());
    }
    resp
}

/// Execute a create request whose key is marked in flight: create (or not)
/// the payment, store the outcome under the key, return it.
async fn execute(fake: FakeStripe, key: String, params: Vec<(String, String)>) -> (u16, Value) {
    let get = |name: &str| {
        params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    let pm = get("payment_method");
    if pm == "pm_slow" {
        tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    }
    let mut inner = fake.inner.lock().unwrap();
    let mut create_payment = |status: &str| {
        let id = format!("pi_fake{:04}", inner.payments.len() + 1);
        let metadata: serde_json::Map<String, Value> = params
            .iter()
            .filter_map(|(k, v)| {
                k.strip_prefix("metadata[")
                    .and_then(|k| k.strip_suffix(']'))
                    .map(|k| (k.to_string(), json!(v)))
            })
            .collect();
        let pi = json!({"id": id, "object": "payment_intent", "amount": get("amount").parse::<i64>().unwrap_or(0),
                        "currency": get("currency"), "status": status, "metadata": metadata});
        inner.payments.push(pi.clone());
        pi
    };
    let (status, body) = match pm.as_str() {
        "pm_card_chargeDeclined" => {
            let pi = create_payment("requires_payment_method");
            (
                402,
                json!({"error": {"type": "card_error", "code": "card_declined", "decline_code": "generic_decline",
                                   "message": "Your card was declined.", "payment_intent": pi}}),
            )
        }
        "pm_decline_nul" => {
            let pi = create_payment("requires_payment_method");
            (
                402,
                json!({"error": {"type": "card_error", "code": "card_declined", "decline_code": "generic_decline",
                                   "message": "Your card was declined.\u{0}\u{0} (after a NUL)", "payment_intent": pi}}),
            )
        }
        "pm_500_after_create" => {
            create_payment("succeeded");
            error(500, "api_error", None, "An unknown error occurred")
        }
        "pm_500_before_create" => error(500, "api_error", None, "An unknown error occurred"),
        _ => (200, create_payment("succeeded")),
    };
    inner.keys.insert(
        key.clone(),
        Stored::Done {
            params,
            status,
            body: body.clone(),
        },
    );
    inner.log.push((key, false, status));
    (status, body)
}
