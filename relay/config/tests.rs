//! The configuration's tests: loading, defaults, overrides, secrets
//! from files, and every check.

use std::time::Duration;

use super::*;

fn load_str(text: &str, env: &[(&str, &str)]) -> anyhow::Result<Config> {
    let dir = std::env::temp_dir().join(format!("outbox-relay-cfg-{}", fastrand::u64(..)));
    std::fs::write(&dir, text).unwrap();
    let r = Config::load(
        Some(&dir),
        env.iter().map(|(k, v)| (k.to_string(), v.to_string())),
    );
    std::fs::remove_file(&dir).ok();
    r
}

#[test]
fn the_example_config_loads_and_states_the_defaults() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/config.example.toml");
    let example =
        Config::load(Some(&path), Vec::new()).expect("deploy/config.example.toml is valid");
    let defaults = Config::load(None, Vec::new()).unwrap();
    assert_eq!(
        format!("{example:?}"),
        format!("{defaults:?}"),
        "the example documents the defaults"
    );
}

/// The fields serde knows under `section` ("" for the top level), from
/// the error that names an unknown one: "expected one of `a`, `b`".
fn fields_of(section: &str) -> Vec<String> {
    let text = match section {
        "" => "__probe = 1".to_string(),
        s => format!("[{s}]\n__probe = 1"),
    };
    let err = format!("{:#}", load_str(&text, &[]).unwrap_err());
    let (_, expected) = err
        .split_once("expected")
        .unwrap_or_else(|| panic!("[{section}] names no fields: {err}"));
    expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(String::from)
        .collect()
}

/// The example's text of `[section]`, its commented lines and
/// subsections (`[section.x]`, `# [[section.x]]`) included.
fn example_section<'a>(example: &'a str, section: &str) -> Vec<&'a str> {
    let header = format!("[{section}]");
    let sub = format!("[{section}.");
    let mut inside = false;
    let mut lines = Vec::new();
    for line in example.lines() {
        if line.starts_with('[') {
            inside = line.starts_with(&header) || line.starts_with(&sub);
        }
        if inside {
            lines.push(line);
        }
    }
    lines
}

fn names_word(lines: &[&str], word: &str) -> bool {
    lines.iter().any(|line| {
        line.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .any(|w| w == word)
    })
}

/// The example is the configuration's reference: every key of every
/// section is in it, set to its default or, where it has none (a URL,
/// a secret), named in a comment.
#[test]
fn the_example_config_names_every_key() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/config.example.toml");
    let example = std::fs::read_to_string(path).unwrap();
    let all: Vec<&str> = example.lines().collect();
    let mut missing = Vec::new();
    for top in fields_of("") {
        if !names_word(&all, &top) {
            missing.push(top.clone());
        }
        let lines = example_section(&example, &top);
        // only a section whose keys serde names: not a map such as
        // [limits], nor an array such as [[schedule]]
        let probed = load_str(&format!("[{top}]\n__probe = 1"), &[]);
        if lines.is_empty() || !probed.is_err_and(|e| format!("{e:#}").contains("unknown field")) {
            continue;
        }
        for field in fields_of(&top) {
            if !names_word(&lines, &field) {
                missing.push(format!("{top}.{field}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "deploy/config.example.toml does not name {missing:?}"
    );
    // the probe reads the fields it should
    assert!(fields_of("relay").contains(&"summary_interval".to_string()));
}

#[test]
fn destination_health_settings_are_checked() {
    let c = load_str(
        r#"
        [webhook.endpoints]
        billing = "https://Pay.Example:443/hooks"
        [limits]
        "https://api.partner.example/ignored" = "50/s"
        billing = "600/min"
        smtp = "20/s"
        [breaker]
        failures = 5
        [breaker.overrides.charge]
        cooldown = "5s"
        [alerts]
        endpoint = "billing"
        dead_threshold = 10
        "#,
        &[],
    )
    .unwrap();
    let h = c.health().unwrap();
    assert_eq!(h.limits["https://api.partner.example"].per_second, 50.0);
    assert_eq!(h.limits["https://pay.example"].per_second, 10.0);
    assert_eq!(h.limits["smtp"].per_second, 20.0);
    let b = h.breaker.unwrap();
    assert_eq!((b.failures, b.cooldown), (5, Duration::from_secs(30)));
    assert_eq!(h.overrides["charge"].cooldown, Duration::from_secs(5));
    assert_eq!(h.overrides["charge"].failures, 5);
    assert_eq!(h.alerts.endpoint.as_deref(), Some("billing"));
    for (text, says) in [
        ("[limits]\npartner = \"50/s\"", "is not a destination"),
        ("[limits]\nsmtp = \"fast\"", "invalid rate"),
        ("[limits]\nsmtp = \"0/s\"", "more than zero"),
        (
            "[breaker]\nfailures = 0",
            "breaker.failures must be at least 1",
        ),
        (
            "[breaker]\ncooldown = \"1m\"\nmax_cooldown = \"10s\"",
            "max_cooldown",
        ),
        (
            "[alerts]\nurl = \"https://a.example/\"\nendpoint = \"x\"",
            "not both",
        ),
        (
            "[alerts]\nendpoint = \"ops\"",
            "is not one of [webhook.endpoints]",
        ),
        ("[alerts]\nurl = \"ftp://a.example/\"", "alerts.url"),
    ] {
        let err = format!("{:#}", load_str(text, &[]).unwrap_err());
        assert!(err.contains(says), "{text}: {err}");
    }
}

#[test]
fn empty_config_gives_the_documented_defaults() {
    let c = Config::load(None, Vec::new()).unwrap();
    assert_eq!(c.relay.concurrency, 64);
    assert_eq!(c.relay.batch_size, 100);
    assert_eq!(c.relay.lease.0, Duration::from_secs(60));
    assert_eq!(c.relay.poll_interval.0, Duration::from_secs(1));
    assert_eq!(c.retry.max_attempts, 10);
    assert_eq!(c.retry.schedule.len(), 6);
    assert_eq!(c.webhook.timeout.0, Duration::from_secs(15));
    assert_eq!(c.relay.metrics_addr.as_deref(), Some("127.0.0.1:9187"));
}

#[test]
fn reads_the_contract_keys() {
    let c = load_str(
        r#"
        database_url = "postgres://u:pw@localhost/db"
        [relay]
        concurrency = 8
        lease = "30s"
        poll_interval = "200ms"
        metrics_addr = "127.0.0.1:0"
        [retry]
        max_attempts = 4
        schedule = ["1s", "2s"]
        [retry.webhook]
        max_attempts = 2
        [webhook]
        signing_secrets = ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]
        timeout = "5s"
        allowed_networks = ["127.0.0.0/8"]
        "#,
        &[],
    )
    .unwrap();
    assert_eq!(c.relay.concurrency, 8);
    assert_eq!(c.relay.poll_interval.0, Duration::from_millis(200));
    assert_eq!(c.retry.policy("webhook").max_attempts, 2);
    assert_eq!(
        c.retry.policy("webhook").schedule,
        [Duration::from_secs(1), Duration::from_secs(2)]
    );
    assert_eq!(c.retry.policy("email").max_attempts, 4);
    assert!(
        !format!("{c:?}").contains("pw@"),
        "database_url must not print"
    );
    assert!(
        !format!("{c:?}").contains("MfKQ9r8"),
        "secrets must not print"
    );
}

/// Configurations with one fault each, and what the error must name.
const ERRORS_BY_KEY: &[(&str, &str)] = &[
    ("[relay]\nconcurency = 3", "concurency"),
    (
        "[relay]\nlease = \"5 parsecs\"",
        "relay.lease: invalid duration \"5 parsecs\"",
    ),
    ("[relay]\nlease = 60", "duration must be a string"),
    ("[relay]\nlease = \"9999999h\"", "longer than a year"),
    ("[[schedule]]\nname = \"d\"\ncron = \"every day\"\nkind = \"email\"\npayload = {}", "cron \"every day\" is invalid"),
    ("[[schedule]]\nname = \"d\"\ncron = \"* * * * * *\"\nkind = \"email\"\npayload = {}\n[[schedule]]\nname = \"d\"\ncron = \"* * * * * *\"\nkind = \"email\"\npayload = {}", "twice"),
    ("[[schedule]]\nname = \"d\"\ncron = \"* * * * * *\"\nkind = \"email\"", "payload"),
    ("[retention]\nintents = \"1h\"\nledger = \"30m\"", "retention.ledger"),
    ("[relay]\nconcurrency = 0", "relay.concurrency"),
    (
        "[relay]\nlease = \"10s\"\n[webhook]\ntimeout = \"15s\"",
        "relay.lease",
    ),
    ("[retry]\nschedule = []", "retry.schedule"),
    (
        "[retry.email]\nmax_attempts = 0",
        "retry.email.max_attempts",
    ),
    (
        "[webhook]\nallowed_networks = [\"nope\"]",
        "webhook.allowed_networks",
    ),
    (
        "[webhook]\nsigning_secrets = [\"plain\"]",
        "webhook.signing_secrets",
    ),
    (
        "[webhook.endpoints]\nx = \"ftp://a\"",
        "webhook.endpoints.x",
    ),
    (
        "[relay]\nmetrics_addr = \"localhost\"",
        "relay.metrics_addr",
    ),
    ("nonsense = 1", "nonsense"),
    (
        "[email]\nsmtp_url = \"http://mail.example.com\"",
        "not supported",
    ),
    (
        "[email]\nsmtp_url = \"smtp://h\"\nfrom = \"nope\"",
        "email.from",
    ),
    (
        "[email]\nsmtp_url = \"smtp://h\"\ntimeout = \"90s\"",
        "relay.lease",
    ),
    ("[email]\non_ambiguous = \"maybe\"", "maybe"),
    (
        "[charge]\napi_key = \"sk_test\"\napi_base = \"ftp://x\"",
        "charge.api_base",
    ),
    ("[charge]\napi_key = \" \"", "is empty"),
    ("[relay", "not valid TOML"),
    // absurd values: each refused with the key named, none panics
    ("[relay]\nlease = \"0s\"", "relay.lease must be at least 1s"),
    ("[relay]\nlease = \"-5s\"", "relay.lease: invalid duration \"-5s\""),
    (
        "[relay]\nlease = \"99999999999999999999s\"",
        "relay.lease: invalid duration \"99999999999999999999s\"",
    ),
    (
        "[relay]\npoll_interval = \"0ms\"",
        "relay.poll_interval must be at least 10ms",
    ),
    (
        "[relay]\nconcurrency = 1000000000",
        "relay.concurrency must be between 1 and 10000, not 1000000000",
    ),
    ("[relay]\nconcurrency = 1e9", "relay.concurrency: invalid type"),
    ("[relay]\nconcurrency = -1", "relay.concurrency"),
    (
        "[relay]\nbatch_size = 0",
        "relay.batch_size must be between 1 and 10000, not 0",
    ),
    (
        "[retry]\nschedule = [\"-1s\"]",
        "retry.schedule[0]: invalid duration \"-1s\"",
    ),
    (
        "[retry.charge]\nschedule = []",
        "retry.charge.schedule must list at least one delay",
    ),
    ("[retry]\njitter = 2.0", "retry.jitter must be between 0.0 and 1.0"),
    ("[retry]\njitter = -1", "retry.jitter must be between 0.0 and 1.0"),
    ("[retry]\njitter = nan", "retry.jitter must be between 0.0 and 1.0"),
    (
        "[retry]\nmax_attempts = 0",
        "retry.max_attempts must be between 1 and 1000",
    ),
    (
        "[retry]\nmax_attempts = 99999999999",
        "retry.max_attempts: invalid value",
    ),
    (
        "[retention]\ninterval = \"0s\"",
        "retention.interval must be at least 1s",
    ),
    (
        "[retention]\nsegment = \"0s\"",
        "retention.segment must be at least 1s",
    ),
    (
        "[webhook]\ntimeout = \"0s\"",
        "webhook.timeout must be at least 100ms",
    ),
    (
        "[email]\nconnect_timeout = \"0s\"",
        "email.connect_timeout must be at least 100ms",
    ),
    (
        "[relay]\nmetrics_addr = \"nonsense\"",
        "relay.metrics_addr \"nonsense\" is not an address",
    ),
    (
        "[[schedule]]\nname = \"d\"\ncron = \"* * *\"\nkind = \"webhook\"\npayload = {}",
        "schedule \"d\": cron \"* * *\" is invalid (too few fields)",
    ),
    (
        "[[schedule]]\nname = \"d\"\ncron = \"61 * * * * *\"\nkind = \"webhook\"\npayload = {}",
        "schedule \"d\": cron \"61 * * * * *\" is invalid (Seconds must be",
    ),
    (
        "[[schedule]]\nname = \"d\"\ncron = \"not a cron\"\nkind = \"webhook\"\npayload = {}",
        "schedule \"d\": cron \"not a cron\" is invalid (The 'Seconds' field",
    ),
    (
        "[[schedule]]\nname = \"d\"\ncron = \"0 0 9 * * *\"\nkind = \"sms\"\npayload = { to = \"+100\" }",
        "schedule \"d\": kind \"sms\" is not one this relay delivers",
    ),
    (
        "[[schedule]]\nname = \"d\"\ncron = \"0 0 9 * * *\"\nkind = \"webhook\"\npayload = { body = 1 }",
        "schedule \"d\": payload: webhook payload has no \"url\"",
    ),
    (
        "[[schedule]]\nname = \"d\"\ncron = \"0 0 9 * * *\"\nkind = \"webhook\"\npayload = { url = \"gopher://x\", body = 1 }",
        "schedule \"d\": payload: webhook url scheme \"gopher\"",
    ),
    (
        "[[schedule]]\nname = \"d\"\ncron = \"0 0 9 * * *\"\nkind = \"email\"\npayload = { to = [\"a@\"], subject = \"s\", text = \"t\" }",
        "schedule \"d\": payload: email \"to\" address \"a@\" is invalid",
    ),
    (
        "[[schedule]]\nname = \"d\"\ncron = \"0 0 9 * * *\"\nkind = \"charge\"\npayload = { amount = 0, currency = \"usd\", payment_method = \"pm\" }",
        "schedule \"d\": payload: charge \"amount\" must be between 1 and 99999999",
    ),
    (
        "[[schedule]]\nname = \"d\"\ncron = \"0 0 9 * * *\"\nkind = \"webhook\"\npayload = \"x\"",
        "schedule \"d\": payload must be a table",
    ),
];

#[test]
fn errors_name_the_key() {
    for (text, needle) in ERRORS_BY_KEY {
        let err = format!("{:#}", load_str(text, &[]).unwrap_err());
        assert!(err.contains(needle), "{text:?}: {err}");
    }
}

#[test]
fn schedules_with_valid_payloads_load() {
    let c = load_str(
        r#"
        [webhook.endpoints]
        ops = "https://ops.example.com/hook"
        [[schedule]]
        name = "ping"
        cron = "0 * * * * *"
        kind = "webhook"
        destination = "ops"
        payload = { body = { ping = true } }
        [[schedule]]
        name = "digest"
        cron = "0 0 9 * * *"
        kind = "email"
        payload = { to = ["ops@example.com"], subject = "Digest", text = "..." }
        [[schedule]]
        name = "fee"
        cron = "0 0 0 1 * *"
        kind = "charge"
        payload = { amount = 500, currency = "eur", payment_method = "pm_card_visa" }
        "#,
        &[],
    )
    .unwrap();
    assert_eq!(c.schedules().unwrap().len(), 3);
    // where email is configured, a payload without "from" needs email.from
    let err = load_str(
        "[email]\nsmtp_url = \"smtp://127.0.0.1:2525\"\n[[schedule]]\nname = \"d\"\ncron = \"0 0 9 * * *\"\nkind = \"email\"\npayload = { to = [\"a@example.com\"], subject = \"s\", text = \"t\" }",
        &[],
    )
    .unwrap_err();
    assert!(
        format!("{err:#}").contains("schedule \"d\": payload: email payload has no \"from\""),
        "{err:#}"
    );
}

#[test]
fn secrets_can_come_from_files() {
    let dir = std::env::temp_dir().join(format!("outbox-relay-secrets-{}", fastrand::u64(..)));
    std::fs::create_dir_all(&dir).unwrap();
    let write = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    let password = write("smtp-password", "12345\n");
    let stripe = write("stripe", "sk_test_from_file\n");
    let signing = write(
        "signing",
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n\nwhsec_c2VjcmV0LXNpZ25pbmcta2V5LTEyMzQ1Njc4OTA=\n",
    );
    let c = load_str(
        "[email]\nsmtp_url = \"smtp://127.0.0.1:2525\"\nfrom = \"a@example.com\"\nusername = \"u\"",
        &[
            ("OUTBOX_RELAY__EMAIL__PASSWORD_FILE", &password),
            ("STRIPE_API_KEY_FILE", &stripe),
            ("OUTBOX_RELAY__WEBHOOK__SIGNING_SECRETS_FILE", &signing),
        ],
    )
    .unwrap();
    // a numeric-looking password stays a string
    assert_eq!(c.email.password.as_ref().unwrap().expose(), "12345");
    // from the environment too
    let from_env = load_str(
        "[email]\nsmtp_url = \"smtp://127.0.0.1:2525\"\nfrom = \"a@example.com\"\nusername = \"u\"",
        &[("OUTBOX_RELAY__EMAIL__PASSWORD", "12345")],
    )
    .unwrap();
    assert_eq!(from_env.email.password.as_ref().unwrap().expose(), "12345");
    assert_eq!(
        c.charge.api_key.as_ref().unwrap().expose(),
        "sk_test_from_file"
    );
    assert_eq!(c.webhook.signing_secrets.len(), 2);
    assert_eq!(
        c.webhook.signing_secrets[1].expose(),
        "whsec_c2VjcmV0LXNpZ25pbmcta2V5LTEyMzQ1Njc4OTA="
    );
    // errors name the variable and the file, never the contents
    let missing = dir.join("missing").display().to_string();
    for (env, needle) in [
        (
            vec![("STRIPE_API_KEY_FILE", missing.as_str())],
            "STRIPE_API_KEY_FILE: cannot read",
        ),
        (
            vec![
                ("STRIPE_API_KEY_FILE", write("empty", "\n").as_str()),
                ("X", "y"),
            ],
            "is empty",
        ),
        (
            vec![
                ("STRIPE_API_KEY_FILE", stripe.as_str()),
                ("STRIPE_API_KEY", "sk_test_env"),
            ],
            "both STRIPE_API_KEY and STRIPE_API_KEY_FILE are set",
        ),
    ] {
        let err = format!("{:#}", load_str("", &env).unwrap_err());
        assert!(err.contains(needle), "{err}");
        assert!(!err.contains("sk_test_from_file"), "{err}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn environment_overrides_the_file() {
    let c = load_str(
        "[relay]\nconcurrency = 8",
        &[
            ("OUTBOX_RELAY__RELAY__CONCURRENCY", "16"),
            ("OUTBOX_RELAY__RELAY__LEASE", "90s"),
            (
                "OUTBOX_RELAY__WEBHOOK__ALLOWED_NETWORKS",
                "[\"127.0.0.1/32\"]",
            ),
            ("UNRELATED", "x"),
        ],
    )
    .unwrap();
    assert_eq!(c.relay.concurrency, 16);
    assert_eq!(c.relay.lease.0, Duration::from_secs(90));
    assert_eq!(c.webhook.allowed_networks, ["127.0.0.1/32"]);
    let c = load_str("", &[("STRIPE_API_KEY", "sk_test_123")]).unwrap();
    assert_eq!(c.charge.api_key.as_ref().unwrap().expose(), "sk_test_123");
    assert!(crate::engine::providers(&c, &Default::default())
        .unwrap()
        .get("charge")
        .is_some());
    assert!(
        crate::engine::providers(&c, &Default::default())
            .unwrap()
            .get("email")
            .is_none(),
        "email needs smtp_url"
    );
    let err = load_str("", &[("OUTBOX_RELAY__RELAY__TYPO", "1")]).unwrap_err();
    assert!(format!("{err:#}").contains("typo"));
}

#[test]
fn the_lookup_token_comes_from_the_file_or_the_environment_and_never_prints() {
    let token = "tok-0123456789abcdef";
    let defaults = load_str("", &[]).unwrap();
    assert!(defaults.relay.lookup && defaults.relay.lookup_token.is_none());
    let dir = std::env::temp_dir().join(format!("outbox-relay-tok-{}", fastrand::u64(..)));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("token");
    std::fs::write(&file, format!("{token}\n")).unwrap();
    let file = file.display().to_string();
    let in_file = format!("[relay]\nlookup_token = \"{token}\"");
    for (text, env) in [
        (in_file.as_str(), vec![]),
        ("", vec![("OUTBOX_RELAY_LOOKUP_TOKEN", token)]),
        ("", vec![("OUTBOX_RELAY_LOOKUP_TOKEN_FILE", file.as_str())]),
        ("", vec![("OUTBOX_RELAY__RELAY__LOOKUP_TOKEN", token)]),
        // the environment overrides the file
        (
            "[relay]\nlookup_token = \"from-the-file-0123456789\"",
            vec![("OUTBOX_RELAY_LOOKUP_TOKEN", token)],
        ),
    ] {
        let c = load_str(text, &env).unwrap();
        assert_eq!(c.relay.lookup_token.as_ref().unwrap().expose(), token);
        assert!(!format!("{c:?}").contains(token), "the token never prints");
    }
    let off = load_str("", &[("OUTBOX_RELAY__RELAY__LOOKUP", "false")]).unwrap();
    assert!(!off.relay.lookup);
    for (env, needle) in [
        (
            vec![("OUTBOX_RELAY_LOOKUP_TOKEN", "short-s3cret")],
            "in environment variable OUTBOX_RELAY_LOOKUP_TOKEN: relay.lookup_token is shorter than 16",
        ),
        (
            vec![("OUTBOX_RELAY_LOOKUP_TOKEN", "s3cret with spaces inside")],
            "relay.lookup_token must be printable ASCII without spaces",
        ),
        (
            vec![
                ("OUTBOX_RELAY_LOOKUP_TOKEN", token),
                ("OUTBOX_RELAY__RELAY__LOOKUP_TOKEN", token),
            ],
            "both OUTBOX_RELAY_LOOKUP_TOKEN and OUTBOX_RELAY__RELAY__LOOKUP_TOKEN are set",
        ),
        (
            vec![
                ("OUTBOX_RELAY_LOOKUP_TOKEN", token),
                ("OUTBOX_RELAY_LOOKUP_TOKEN_FILE", file.as_str()),
            ],
            "both OUTBOX_RELAY_LOOKUP_TOKEN and OUTBOX_RELAY_LOOKUP_TOKEN_FILE are set",
        ),
    ] {
        let err = format!("{:#}", load_str("", &env).unwrap_err());
        assert!(err.contains(needle), "{err}");
        assert!(!err.contains("s3cret") && !err.contains(token), "{err}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn errors_from_the_environment_name_the_variable() {
    let dir = std::env::temp_dir().join(format!("outbox-relay-env-{}", fastrand::u64(..)));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("timeout");
    std::fs::write(&file, "soon\n").unwrap();
    let file = file.display().to_string();
    for (env, file_text, needle) in [
        (
            vec![("OUTBOX_RELAY__RELAY__CONCURRENCY", "lots")],
            "[relay]\nconcurrency = 8",
            "in environment variable OUTBOX_RELAY__RELAY__CONCURRENCY: invalid configuration: \
             relay.concurrency: invalid type: string \"lots\", expected u32",
        ),
        (
            vec![("OUTBOX_RELAY__RELAY__TYPO", "1")],
            "",
            "in environment variable OUTBOX_RELAY__RELAY__TYPO: invalid configuration: \
             relay.typo: unknown field `typo`",
        ),
        (
            vec![("OUTBOX_RELAY__RETRY__SCHEDULE", "[\"1s\", \"later\"]")],
            "",
            "in environment variable OUTBOX_RELAY__RETRY__SCHEDULE: invalid configuration: \
             retry.schedule[1]: invalid duration \"later\"",
        ),
        (
            vec![("OUTBOX_RELAY__RELAY__CONCURRENCY", "0")],
            "",
            "in environment variable OUTBOX_RELAY__RELAY__CONCURRENCY: relay.concurrency must be \
             between 1 and 10000, not 0",
        ),
        (
            vec![("OUTBOX_RELAY__WEBHOOK__TIMEOUT_FILE", file.as_str())],
            "",
            "in environment variable OUTBOX_RELAY__WEBHOOK__TIMEOUT_FILE: invalid configuration: \
             webhook.timeout: invalid duration \"soon\"",
        ),
        (
            vec![("STRIPE_API_KEY", " ")],
            "",
            "in environment variable STRIPE_API_KEY: charge.api_key (STRIPE_API_KEY) is empty",
        ),
        (
            vec![("OUTBOX_RELAY__RELAY__LEASE", "10s")],
            "[webhook]\ntimeout = \"15s\"",
            "in environment variable OUTBOX_RELAY__RELAY__LEASE: relay.lease (10s) must exceed",
        ),
    ] {
        let err = format!("{:#}", load_str(file_text, &env).unwrap_err());
        assert!(err.contains(needle), "{env:?}: {err}");
    }
    // a bad value in the file is the file's, whatever else the environment sets
    let err = load_str(
        "[relay]\nlease = \"soon\"",
        &[("OUTBOX_RELAY__RELAY__CONCURRENCY", "8")],
    )
    .unwrap_err();
    let err = format!("{err:#}");
    assert!(
        err.contains("in /") && err.contains("relay.lease") && !err.contains("OUTBOX_RELAY__"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `[kafka]` sections with one fault each, and what the error must name.
const KAFKA_ERRORS: &[(&str, &str)] = &[
    ("brokers = \"\"", "kafka.brokers is empty"),
    ("brokers = \"kafka://k1:9092\"", "without a scheme"),
    ("brokers = \"k1\"", "must be host:port"),
    ("brokers = \"k1:0\"", "must be host:port"),
    (
        "brokers = \"k1:9092\"\nsecurity_protocol = \"tls\"",
        "kafka.security_protocol \"tls\"",
    ),
    (
        "brokers = \"k1:9092\"\nsecurity_protocol = \"sasl_ssl\"",
        "needs kafka.sasl_mechanism",
    ),
    (
        "brokers = \"k1:9092\"\nsecurity_protocol = \"sasl_ssl\"\nsasl_mechanism = \"GSSAPI\"",
        "kafka.sasl_mechanism \"GSSAPI\"",
    ),
    (
        "brokers = \"k1:9092\"\nsasl_mechanism = \"PLAIN\"",
        "kafka.security_protocol is \"plaintext\"",
    ),
    (
        "brokers = \"k1:9092\"\nsecurity_protocol = \"sasl_ssl\"\nsasl_mechanism = \"PLAIN\"",
        "needs kafka.user and a password",
    ),
    (
        "brokers = \"k1:9092\"\nuser = \"relay\"",
        "used only with security_protocol",
    ),
    (
        "brokers = \"k1:9092\"\ntls_ca_file = \"/ca.pem\"",
        "kafka.tls_ca_file is used only",
    ),
    (
        "brokers = \"k1:9092\"\ncompression = \"brotli\"",
        "kafka.compression \"brotli\"",
    ),
    (
        "brokers = \"k1:9092\"\nlinger = \"6s\"",
        "kafka.linger must be at most 5s",
    ),
    (
        "brokers = \"k1:9092\"\ntimeout = \"1s\"\nlinger = \"600ms\"",
        "shorter than half of kafka.timeout",
    ),
    (
        "brokers = \"k1:9092\"\nreconcile_window = \"10ms\"",
        "at least 1s",
    ),
    (
        "brokers = \"k1:9092\"\ntimeout = \"50ms\"",
        "kafka.timeout must be at least 100ms",
    ),
    ("brokers = \"k1:9092\"\ntimeout = \"60s\"", "relay.lease"),
    ("brokers = \"k1:9092\"\nacks = \"0\"", "unknown field"),
];

#[test]
fn the_kafka_section_is_checked_and_its_password_stays_secret() {
    // off without brokers; a password alone is a mistake
    assert!(load_str("", &[])
        .unwrap()
        .kafka
        .provider_config()
        .unwrap()
        .is_none());
    let err = load_str("", &[("OUTBOX_RELAY__KAFKA__PASSWORD", "pw")]).unwrap_err();
    assert!(
        format!("{err:#}").contains("kafka.brokers is not"),
        "{err:#}"
    );

    let ok = load_str(
        "[kafka]\nbrokers = \"k1.internal:9093, k2.internal:9093\"\nsecurity_protocol = \"sasl_ssl\"\n\
         sasl_mechanism = \"SCRAM-SHA-512\"\nuser = \"relay\"\ncompression = \"zstd\"\n",
        &[("OUTBOX_RELAY__KAFKA__PASSWORD", "hunter2-kafka")],
    )
    .unwrap();
    let kafka = ok.kafka.provider_config().unwrap().unwrap();
    assert_eq!(
        kafka.password.as_ref().map(|p| p.expose()),
        Some("hunter2-kafka")
    );
    assert!(
        !format!("{ok:?}").contains("hunter2-kafka"),
        "no secret in Debug"
    );
    assert_eq!(kafka.timeout, Duration::from_secs(10));
    assert_eq!(kafka.reconcile_window, Duration::from_secs(15 * 60));
    assert_eq!(
        kafka.on_ambiguous,
        outbox_providers::AmbiguityPolicy::Redeliver
    );

    // `username`, as the contract names it, is `user`, in the file and in
    // the environment
    let sasl = "[kafka]\nbrokers = \"k1:9093\"\nsecurity_protocol = \"sasl_ssl\"\n\
                sasl_mechanism = \"PLAIN\"\n";
    let password = ("OUTBOX_RELAY__KAFKA__PASSWORD", "pw");
    for (text, env) in [
        (format!("{sasl}username = \"relay\"\n"), vec![password]),
        (
            sasl.to_string(),
            vec![password, ("OUTBOX_RELAY__KAFKA__USERNAME", "relay")],
        ),
    ] {
        let c = load_str(&text, &env).unwrap();
        assert_eq!(c.kafka.user.as_deref(), Some("relay"), "{text} {env:?}");
    }

    for (text, needle) in KAFKA_ERRORS {
        let err = load_str(&format!("[kafka]\n{text}\n"), &[]).unwrap_err();
        assert!(format!("{err:#}").contains(needle), "{text}: {err:#}");
    }

    // a PLAIN password in the clear only to loopback, or when allowed
    let plain =
        "security_protocol = \"sasl_plaintext\"\nsasl_mechanism = \"PLAIN\"\nuser = \"relay\"";
    let env = [("OUTBOX_RELAY__KAFKA__PASSWORD", "pw")];
    let err = load_str(
        &format!("[kafka]\nbrokers = \"k1.internal:9092\"\n{plain}\n"),
        &env,
    )
    .unwrap_err();
    assert!(format!("{err:#}").contains("without TLS"), "{err:#}");
    load_str(
        &format!("[kafka]\nbrokers = \"127.0.0.1:9092\"\n{plain}\n"),
        &env,
    )
    .unwrap();
    load_str(
        &format!("[kafka]\nbrokers = \"k1.internal:9092\"\nallow_plaintext = true\n{plain}\n"),
        &env,
    )
    .unwrap();
}
