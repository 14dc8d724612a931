//! Table-driven tests of envelope decoding and validation.

use super::*;
use crate::limits::MAX_REQUEST_ENVELOPE_BYTES;

const PROFILES: &[&str] = &["chrome_131", "firefox_133"];

fn ctx() -> ValidationContext<'static> {
    ValidationContext {
        max_inline_request_body_bytes: 1024,
        max_timeout_ms: 120_000,
        default_timeout_ms: 60_000,
        is_object_storage_enabled: true,
        fingerprint_profiles: PROFILES,
    }
}

fn decode_with(s: &str, c: &ValidationContext<'_>) -> Result<ValidatedRequest, ApiError> {
    let mut buf = s.as_bytes().to_vec();
    decode_request(&mut buf, c)
}

fn decode(s: &str) -> Result<ValidatedRequest, ApiError> {
    decode_with(s, &ctx())
}

fn err(s: &str) -> (ErrorCode, String) {
    let e = decode(s).expect_err(s);
    (e.code, e.message)
}

#[test]
fn minimal_request_gets_defaults() {
    let r = decode(r#"{"method":"GET","url":"https://example.com"}"#).unwrap();
    assert_eq!(r.method, Method::Get);
    assert_eq!(r.url.path_and_query, "/");
    assert!(r.headers.is_empty());
    assert_eq!(r.body, RequestBody::None);
    assert!(r.routing.is_empty());
    assert_eq!(r.response_body_mode, ResponseBodyMode::InlineBase64);
    assert_eq!(r.fingerprint_profile, None);
    assert_eq!(r.timeout_ms, 60_000);
    assert!(!r.is_replayable);
}

#[test]
fn full_request() {
    let r = decode(
        r#"{"method":"POST","url":"http://api.example.com:8080/v1?x=1",
            "headers":[{"name":"Accept","value_base64":"YQ=="},{"name":"accept","value_base64":"Yg=="}],
            "body":{"mode":"inline_base64","data_base64":"aGVsbG8="},
            "routing":{"tags":["residential","fast"],"country":"us","region":"us-east",
                       "ip_type":"residential","sticky_session_id":"s1"},
            "response_body_mode":"receipt","fingerprint_profile":"chrome_131",
            "timeout_ms":5000,"replayable":true}"#,
    )
    .unwrap();
    assert_eq!(r.method, Method::Post);
    assert_eq!(r.url.authority(), "api.example.com:8080");
    assert_eq!(r.headers.len(), 2);
    assert_eq!(r.headers[0].value(), b"a");
    assert_eq!(r.headers[1].name(), "accept");
    assert_eq!(r.body, RequestBody::Inline(b"hello".to_vec()));
    assert_eq!(r.routing.tags, vec!["residential", "fast"]);
    assert_eq!(r.routing.country.unwrap().as_str(), "US");
    assert_eq!(r.routing.region.as_deref(), Some("us-east"));
    assert_eq!(r.routing.sticky_session_id.as_deref(), Some("s1"));
    assert_eq!(r.response_body_mode, ResponseBodyMode::Receipt);
    assert_eq!(r.fingerprint_profile.as_deref(), Some("chrome_131"));
    assert_eq!(r.timeout_ms, 5000);
    assert!(r.is_replayable);
}

/// An alias of a profile (curl_cffi's target name, a family's moving name) is held as the
/// profile's own name, which is what workers advertise; names stay case-sensitive.
#[test]
fn a_profile_alias_is_held_as_the_profile_name() {
    for (given, held) in [("firefox133", "firefox_133"), ("chrome131", "chrome_131")] {
        let r = decode(&format!(
            r#"{{"method":"GET","url":"https://a.b/","fingerprint_profile":"{given}"}}"#
        ))
        .unwrap();
        assert_eq!(r.fingerprint_profile.as_deref(), Some(held), "{given}");
    }
    // A known alias of a profile this context does not list, and a wrong case, are not names.
    for name in ["chrome", "Chrome131", "firefox133 "] {
        let json =
            format!(r#"{{"method":"GET","url":"https://a.b/","fingerprint_profile":"{name}"}}"#);
        assert!(decode(&json).is_err(), "{name}");
    }
}

#[test]
fn every_method() {
    for m in [
        "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE",
    ] {
        let r = decode(&format!(r#"{{"method":"{m}","url":"http://a.example"}}"#)).unwrap();
        assert_eq!(r.method.as_str(), m);
    }
}

#[test]
fn timeouts() {
    let t = |v: &str| {
        decode(&format!(
            r#"{{"method":"GET","url":"http://a.b","timeout_ms":{v}}}"#
        ))
    };
    assert_eq!(t("1000").unwrap().timeout_ms, 1000);
    assert_eq!(t("999999999").unwrap().timeout_ms, 120_000);
    assert_eq!(t("999").unwrap_err().code, ErrorCode::InvalidRequest);
    assert_eq!(t("0").unwrap_err().code, ErrorCode::InvalidRequest);
    assert_eq!(t("-1").unwrap_err().code, ErrorCode::InvalidRequest);
    assert_eq!(t("1500.5").unwrap_err().code, ErrorCode::InvalidRequest);
    assert_eq!(t("\"2000\"").unwrap_err().code, ErrorCode::InvalidRequest);
    // The static cap also limits the snapshot default.
    let c = ValidationContext {
        default_timeout_ms: 200_000,
        max_timeout_ms: 90_000,
        ..ctx()
    };
    let r = decode_with(r#"{"method":"GET","url":"http://a.b"}"#, &c).unwrap();
    assert_eq!(r.timeout_ms, 90_000);
}

#[test]
fn inline_body_limit_is_exact_and_has_details() {
    use base64::Engine as _;
    let enc = |n: usize| base64::engine::general_purpose::STANDARD.encode(vec![7u8; n]);
    let req = |n: usize| {
        format!(
            r#"{{"method":"POST","url":"http://a.b","body":{{"mode":"inline_base64","data_base64":"{}"}}}}"#,
            enc(n)
        )
    };
    assert_eq!(
        decode(&req(1024)).unwrap().body,
        RequestBody::Inline(vec![7; 1024])
    );
    for n in [1025, 1026, 1027, 5000] {
        let e = decode(&req(n)).unwrap_err();
        assert_eq!(e.code, ErrorCode::BodyTooLarge, "{n}");
        assert_eq!(e.http_status(), 413);
        assert!(e.details.contains(&("direction".into(), "request".into())));
        assert!(e.details.contains(&("limit_bytes".into(), "1024".into())));
    }
    assert_eq!(decode(&req(0)).unwrap().body, RequestBody::Inline(vec![]));
}

#[test]
fn rejections() {
    use ErrorCode::*;
    let rid = format!("rcpt_{}", "0".repeat(32));
    let cases: Vec<(String, ErrorCode, &str)> = vec![
        // Strict JSON.
        (r#"{"method":"GET","url":"http://a.b","x":1}"#.into(), InvalidRequest, "unknown field"),
        (r#"{"method":"GET","url":"http://a.b"} {}"#.into(), InvalidRequest, "trailing"),
        (r#"{"method":"GET","method":"GET","url":"http://a.b"}"#.into(), InvalidRequest, "duplicate"),
        (r#"{"method":"GET"}"#.into(), InvalidRequest, "missing field"),
        (r#"[]"#.into(), InvalidRequest, "request envelope"),
        (r#""#.into(), InvalidRequest, "empty"),
        (r#"{"method":"GET","url":"http://a.b","headers":null}"#.into(), InvalidRequest, "expected an array"),
        (r#"{"method":"GET","url":"http://a.b","routing":{"tags":["a"],"x":1}}"#.into(), InvalidRequest, "unknown field"),
        (r#"{"method":"GET","url":"http://a.b","headers":[{"name":"a","value_base64":"","x":1}]}"#.into(), InvalidRequest, "unknown field"),
        (r#"{"method":"GET","url":"http://a.b","body":{"mode":"receipt","receipt_id":"x","y":1}}"#.into(), InvalidRequest, "unknown field"),
        (r#"{"method":"GET","url":"http://a.b","replayable":"true"}"#.into(), InvalidRequest, "request envelope"),
        // Method.
        (r#"{"method":"CONNECT","url":"http://a.b"}"#.into(), InvalidRequest, "CONNECT"),
        (r#"{"method":"connect","url":"http://a.b"}"#.into(), InvalidRequest, "CONNECT"),
        (r#"{"method":"get","url":"http://a.b"}"#.into(), InvalidRequest, "uppercase"),
        (r#"{"method":"PROPFIND","url":"http://a.b"}"#.into(), InvalidRequest, "one of"),
        // URL.
        (r#"{"method":"GET","url":"ftp://a.b"}"#.into(), InvalidRequest, "url:"),
        (r#"{"method":"GET","url":"http://u@a.b"}"#.into(), InvalidRequest, "user info"),
        (r#"{"method":"GET","url":"http://a.b/#x"}"#.into(), InvalidRequest, "fragment"),
        (r#"{"method":"GET","url":"http://[fe80::1%25lo]/"}"#.into(), InvalidRequest, "zone"),
        (r#"{"method":"GET","url":"http:///x"}"#.into(), InvalidRequest, "empty"),
        (r#"{"method":"GET","url":"http://a_b-.c/"}"#.into(), InvalidRequest, "malformed"),
        // Headers.
        (r#"{"method":"GET","url":"http://a.b","headers":[{"name":"X","value_base64":"YQ0KYjpj"}]}"#.into(), HeaderInjectionFailed, "CR, LF"),
        (r#"{"method":"GET","url":"http://a.b","headers":[{"name":"X","value_base64":"YQ\r\n=="}]}"#.into(), HeaderInjectionFailed, "CR or LF"),
        (r#"{"method":"GET","url":"http://a.b","headers":[{"name":"Host","value_base64":"YQ=="}]}"#.into(), InvalidRequest, "Host"),
        (r#"{"method":"GET","url":"http://a.b","headers":[{"name":"X","value_base64":"YQ"}]}"#.into(), InvalidRequest, "base64"),
        // Body.
        (r#"{"method":"POST","url":"http://a.b","body":{"mode":"inline_base64"}}"#.into(), InvalidRequest, "needs data_base64"),
        (format!(r#"{{"method":"POST","url":"http://a.b","body":{{"mode":"inline_base64","data_base64":"","receipt_id":"{rid}"}}}}"#), InvalidRequest, "cannot carry receipt_id"),
        (r#"{"method":"POST","url":"http://a.b","body":{"mode":"inline_base64","data_base64":"!!"}}"#.into(), InvalidRequest, "base64"),
        (r#"{"method":"POST","url":"http://a.b","body":{"mode":"receipt"}}"#.into(), InvalidRequest, "needs receipt_id"),
        (r#"{"method":"POST","url":"http://a.b","body":{"mode":"receipt","receipt_id":"r1"}}"#.into(), InvalidRequest, "not a receipt id"),
        (format!(r#"{{"method":"POST","url":"http://a.b","body":{{"mode":"receipt","receipt_id":"{rid}","data_base64":""}}}}"#), InvalidRequest, "cannot carry data_base64"),
        (r#"{"method":"POST","url":"http://a.b","body":{"mode":"stream"}}"#.into(), InvalidRequest, "body.mode"),
        (r#"{"method":"TRACE","url":"http://a.b","body":{"mode":"inline_base64","data_base64":""}}"#.into(), InvalidRequest, "TRACE"),
        // Routing.
        (r#"{"method":"GET","url":"http://a.b","routing":{"tags":[""]}}"#.into(), InvalidRequest, "tags[0]"),
        (r#"{"method":"GET","url":"http://a.b","routing":{"tags":["a","a"]}}"#.into(), InvalidRequest, "duplicate tag"),
        (format!(r#"{{"method":"GET","url":"http://a.b","routing":{{"tags":["{}"]}}}}"#, "t".repeat(65)), InvalidRequest, "64 bytes"),
        (format!(r#"{{"method":"GET","url":"http://a.b","routing":{{"tags":[{}]}}}}"#, (0..33).map(|i| format!("\"t{i}\"")).collect::<Vec<_>>().join(",")), InvalidRequest, "at most 32"),
        (r#"{"method":"GET","url":"http://a.b","routing":{"country":"USA"}}"#.into(), InvalidRequest, "country"),
        (r#"{"method":"GET","url":"http://a.b","routing":{"country":"ZZ"}}"#.into(), InvalidRequest, "country"),
        (r#"{"method":"GET","url":"http://a.b","routing":{"region":""}}"#.into(), InvalidRequest, "routing.region"),
        (format!(r#"{{"method":"GET","url":"http://a.b","routing":{{"ip_type":"{}"}}}}"#, "i".repeat(129)), InvalidRequest, "routing.ip_type"),
        (format!(r#"{{"method":"GET","url":"http://a.b","routing":{{"sticky_session_id":"{}"}}}}"#, "s".repeat(257)), InvalidRequest, "sticky_session_id"),
        // Modes and profile.
        (r#"{"method":"GET","url":"http://a.b","response_body_mode":"stream"}"#.into(), InvalidRequest, "response_body_mode"),
        (r#"{"method":"GET","url":"http://a.b","fingerprint_profile":"Chrome_131"}"#.into(), InvalidRequest, "fingerprint_profile"),
        (r#"{"method":"GET","url":"http://a.b","fingerprint_profile":""}"#.into(), InvalidRequest, "fingerprint_profile"),
    ];
    for (input, code, needle) in cases {
        let (got, msg) = err(&input);
        assert_eq!(got, code, "{input}: {msg}");
        assert!(
            msg.contains(needle),
            "{input}: message {msg:?} lacks {needle:?}"
        );
    }
}

#[test]
fn invalid_utf8_is_rejected() {
    let mut buf = b"{\"method\":\"GET\",\"url\":\"http://a.b/\xc3\x28\"}".to_vec();
    let e = decode_request(&mut buf, &ctx()).unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidRequest);
    assert!(e.message.contains("UTF-8"), "{}", e.message);
}

#[test]
fn envelope_over_four_mib_is_rejected_before_parsing() {
    let mut buf = vec![b' '; MAX_REQUEST_ENVELOPE_BYTES + 1];
    let e = decode_request(&mut buf, &ctx()).unwrap_err();
    assert_eq!(e.code, ErrorCode::BodyTooLarge);
    assert_eq!(e.http_status(), 413);
    assert!(e.message.contains("larger than 4194304"), "{}", e.message);
    assert!(e
        .details
        .contains(&("limit_bytes".into(), "4194304".into())));
}

#[test]
fn header_count_limit() {
    let hs = |n: usize| {
        (0..n)
            .map(|i| format!(r#"{{"name":"x-{i}","value_base64":"YQ=="}}"#))
            .collect::<Vec<_>>()
            .join(",")
    };
    let req = |n: usize| {
        format!(
            r#"{{"method":"GET","url":"http://a.b","headers":[{}]}}"#,
            hs(n)
        )
    };
    assert_eq!(decode(&req(64)).unwrap().headers.len(), 64);
    let e = decode(&req(65)).unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidRequest);
    assert!(e.message.contains("at most 64"));
}

#[test]
fn receipt_modes_need_object_storage() {
    let c = ValidationContext {
        is_object_storage_enabled: false,
        ..ctx()
    };
    let rid = format!("rcpt_{}", "0".repeat(32));
    let e = decode_with(
        r#"{"method":"GET","url":"http://a.b","response_body_mode":"receipt"}"#,
        &c,
    )
    .unwrap_err();
    assert!(e.message.contains("object storage"));
    let e = decode_with(
        &format!(r#"{{"method":"PUT","url":"http://a.b","body":{{"mode":"receipt","receipt_id":"{rid}"}}}}"#),
        &c,
    )
    .unwrap_err();
    assert!(e.message.contains("object storage"));
    let ok = decode(&format!(
        r#"{{"method":"PUT","url":"http://a.b","body":{{"mode":"receipt","receipt_id":"{rid}"}}}}"#
    ))
    .unwrap();
    assert_eq!(ok.body, RequestBody::Receipt(rid));
}

#[test]
fn empty_tag_list_and_empty_sticky_id_are_no_hints() {
    let r = decode(
        r#"{"method":"GET","url":"http://a.b","routing":{"tags":[],"sticky_session_id":""}}"#,
    )
    .unwrap();
    assert!(r.routing.tags.is_empty());
    assert_eq!(r.routing.sticky_session_id.as_deref(), Some(""));
}
