//! A charge intent's payload → Stripe PaymentIntent form parameters.
//!
//! The parameters are built in a fixed order from a jsonb payload (whose
//! object keys come back sorted), so every attempt sends byte-identical
//! parameters under the same Idempotency-Key.

use serde_json::Value;

use crate::keys;
use crate::webhook::request::type_name;

/// ISO 4217 currencies Stripe charges in (lowercase).
const CURRENCIES: &[&str] = &[
    "aed", "afn", "all", "amd", "ang", "aoa", "ars", "aud", "awg", "azn", "bam", "bbd", "bdt",
    "bgn", "bhd", "bif", "bmd", "bnd", "bob", "brl", "bsd", "bwp", "byn", "bzd", "cad", "cdf",
    "chf", "clp", "cny", "cop", "crc", "cve", "czk", "djf", "dkk", "dop", "dzd", "egp", "etb",
    "eur", "fjd", "fkp", "gbp", "gel", "gip", "gmd", "gnf", "gtq", "gyd", "hkd", "hnl", "htg",
    "huf", "idr", "ils", "inr", "isk", "jmd", "jod", "jpy", "kes", "kgs", "khr", "kmf", "krw",
    "kwd", "kyd", "kzt", "lak", "lbp", "lkr", "lrd", "lsl", "mad", "mdl", "mga", "mkd", "mmk",
    "mnt", "mop", "mur", "mvr", "mwk", "mxn", "myr", "mzn", "nad", "ngn", "nio", "nok", "npr",
    "nzd", "omr", "pab", "pen", "pgk", "php", "pkr", "pln", "pyg", "qar", "ron", "rsd", "rub",
    "rwf", "sar", "sbd", "scr", "sek", "sgd", "shp", "sle", "sos", "srd", "std", "szl", "thb",
    "tjs", "tnd", "top", "try", "ttd", "twd", "tzs", "uah", "ugx", "usd", "uyu", "uzs", "vnd",
    "vuv", "wst", "xaf", "xcd", "xof", "xpf", "yer", "zar", "zmw",
];

/// Metadata keys the relay writes itself.
pub const META_INTENT_KEY: &str = "outbox_intent_key";
pub const META_IDEMPOTENCY_KEY: &str = "outbox_idempotency_key";

/// The Idempotency-Key for an intent (≤ 255 characters).
pub fn idempotency_key(key: &str, generation: i32) -> String {
    format!(
        "outbox-relay-{}",
        keys::effect_key(key, "charge", generation)
    )
}

/// Validate the payload and build the form parameters, in a fixed order.
pub fn form(payload: &Value, key: &str, generation: i32) -> Result<Vec<(String, String)>, String> {
    let obj = payload.as_object().ok_or_else(|| {
        format!(
            "charge payload must be a JSON object, not {}",
            type_name(payload)
        )
    })?;
    if let Some(unknown) = obj.keys().find(|k| {
        !matches!(
            k.as_str(),
            "amount" | "currency" | "payment_method" | "customer" | "description" | "metadata"
        )
    }) {
        return Err(format!(
            "charge payload has an unknown field {unknown:?} (expected amount, currency, payment_method, customer, description, metadata)"
        ));
    }
    let amount = match obj.get("amount") {
        Some(Value::Number(n)) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => i,
            (None, Some(f)) if f.fract() != 0.0 => {
                return Err(format!(
                    "charge \"amount\" must be a whole number of minor units, not {n}"
                ))
            }
            // whole, but beyond i64 (a u64, or a float like 1e20)
            (None, Some(f)) if !(1.0..=99_999_999.0).contains(&f) => {
                return Err(format!(
                    "charge \"amount\" must be between 1 and 99999999 minor units, not {n}"
                ))
            }
            // 1999.0: whole, but a float is not sent as a parameter unchanged
            _ => {
                return Err(format!(
                    "charge \"amount\" must be written as an integer number of minor units (e.g. 1999), not {n}"
                ))
            }
        },
        Some(other) => {
            return Err(format!(
                "charge \"amount\" must be an integer, not {}",
                type_name(other)
            ))
        }
        None => return Err("charge payload has no \"amount\"".into()),
    };
    if !(1..=99_999_999).contains(&amount) {
        return Err(format!(
            "charge \"amount\" must be between 1 and 99999999 minor units, not {amount}"
        ));
    }
    let currency =
        string(obj.get("currency"), "currency")?.ok_or("charge payload has no \"currency\"")?;
    if !CURRENCIES.contains(&currency.as_str()) {
        return Err(format!("charge \"currency\" {currency:?} is not a known ISO 4217 currency code (lowercase, e.g. \"usd\")"));
    }
    let payment_method = string(obj.get("payment_method"), "payment_method")?
        .filter(|p| !p.is_empty())
        .ok_or("charge payload has no \"payment_method\"")?;
    let mut params = vec![
        ("amount".to_string(), amount.to_string()),
        ("currency".to_string(), currency),
        ("payment_method".to_string(), payment_method),
        ("confirm".to_string(), "true".to_string()),
    ];
    if let Some(c) = string(obj.get("customer"), "customer")? {
        params.push(("customer".into(), c));
    }
    if let Some(d) = string(obj.get("description"), "description")? {
        if d.chars().count() > 1000 {
            return Err("charge \"description\" is longer than 1000 characters".into());
        }
        params.push(("description".into(), d));
    }
    match obj.get("metadata") {
        None | Some(Value::Null) => {}
        Some(Value::Object(meta)) => {
            if meta.len() > 48 {
                return Err("charge \"metadata\" has more than 48 keys".into());
            }
            for (k, v) in meta {
                if k == META_INTENT_KEY || k == META_IDEMPOTENCY_KEY {
                    return Err(format!("charge metadata key {k:?} is set by the relay"));
                }
                if k.is_empty() || k.chars().count() > 40 || k.contains(['[', ']']) {
                    return Err(format!(
                        "charge metadata key {k:?} must be 1 to 40 characters without brackets"
                    ));
                }
                let Value::String(v) = v else {
                    return Err(format!("charge metadata value for {k:?} must be a string"));
                };
                if v.chars().count() > 500 {
                    return Err(format!(
                        "charge metadata value for {k:?} is longer than 500 characters"
                    ));
                }
                params.push((format!("metadata[{k}]"), v.clone()));
            }
        }
        Some(other) => {
            return Err(format!(
                "charge \"metadata\" must be an object, not {}",
                type_name(other)
            ))
        }
    }
    params.push((format!("metadata[{META_INTENT_KEY}]"), key.to_string()));
    params.push((
        format!("metadata[{META_IDEMPOTENCY_KEY}]"),
        idempotency_key(key, generation),
    ));
    Ok(params)
}

fn string(v: Option<&Value>, field: &str) -> Result<Option<String>, String> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(format!(
            "charge \"{field}\" must be a string, not {}",
            type_name(other)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn builds_identical_parameters_every_time() {
        let p = json!({"amount": 1999, "currency": "usd", "payment_method": "pm_card_visa",
                       "customer": "cus_1", "description": "Order 42", "metadata": {"order": "42", "a": "b"}});
        let f = form(&p, "order:42", 0).unwrap();
        assert_eq!(f, form(&p, "order:42", 0).unwrap());
        let names: Vec<_> = f.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            [
                "amount",
                "currency",
                "payment_method",
                "confirm",
                "customer",
                "description",
                "metadata[a]",
                "metadata[order]",
                "metadata[outbox_intent_key]",
                "metadata[outbox_idempotency_key]"
            ]
        );
        assert_eq!(f[8].1, "order:42");
        assert_eq!(f[9].1, idempotency_key("order:42", 0));
        assert!(idempotency_key(&"k".repeat(512), 7).len() <= 255);
        assert_ne!(idempotency_key("k", 0), idempotency_key("k", 1));
    }

    #[test]
    fn refuses_bad_payloads_with_a_reason() {
        for (payload, needle) in [
            (json!([]), "must be a JSON object"),
            (
                json!({"currency": "usd", "payment_method": "pm"}),
                "no \"amount\"",
            ),
            (
                json!({"amount": 0, "currency": "usd", "payment_method": "pm"}),
                "between 1 and",
            ),
            (
                json!({"amount": -5, "currency": "usd", "payment_method": "pm"}),
                "between 1 and",
            ),
            (
                json!({"amount": 10.5, "currency": "usd", "payment_method": "pm"}),
                "whole number",
            ),
            (
                json!({"amount": "10", "currency": "usd", "payment_method": "pm"}),
                "must be an integer",
            ),
            (
                json!({"amount": 100_000_000, "currency": "usd", "payment_method": "pm"}),
                "between 1 and 99999999 minor units, not 100000000",
            ),
            (
                json!({"amount": u64::MAX, "currency": "usd", "payment_method": "pm"}),
                "between 1 and 99999999 minor units, not 18446744073709551615",
            ),
            (
                json!({"amount": 1e20, "currency": "usd", "payment_method": "pm"}),
                "between 1 and 99999999 minor units",
            ),
            (
                json!({"amount": 1999.0, "currency": "usd", "payment_method": "pm"}),
                "must be written as an integer number of minor units (e.g. 1999), not 1999.0",
            ),
            (
                json!({"amount": 10, "currency": "usx", "payment_method": "pm"}),
                "not a known ISO 4217",
            ),
            (
                json!({"amount": 10, "currency": "USD", "payment_method": "pm"}),
                "not a known ISO 4217",
            ),
            (
                json!({"amount": 10, "payment_method": "pm"}),
                "no \"currency\"",
            ),
            (
                json!({"amount": 10, "currency": "usd"}),
                "no \"payment_method\"",
            ),
            (
                json!({"amount": 10, "currency": "usd", "payment_method": "pm", "metadata": {"x": 1}}),
                "must be a string",
            ),
            (
                json!({"amount": 10, "currency": "usd", "payment_method": "pm", "metadata": {"outbox_intent_key": "x"}}),
                "set by the relay",
            ),
            (
                json!({"amount": 10, "currency": "usd", "payment_method": "pm", "tip": 1}),
                "unknown field",
            ),
        ] {
            let err = form(&payload, "k", 0).unwrap_err();
            assert!(
                err.contains(needle),
                "{payload}: {err:?} should mention {needle:?}"
            );
        }
    }
}
