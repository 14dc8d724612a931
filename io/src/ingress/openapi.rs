//! The OpenAPI 3.1 documents of the two HTTP listeners, served at `GET /api/v1/openapi.json`
//! without a token. The documents live in `docs/openapi/` and are embedded as they are, so the
//! served bytes are the reviewed file; the tests below keep their limits and error registry in
//! step with the constants the code enforces.

/// Path of the document on both listeners.
pub const OPENAPI_PATH: &str = "/api/v1/openapi.json";

/// The API listener's document: the request API and the receipt API.
pub const API_DOCUMENT: &[u8] = include_bytes!("../../../docs/openapi/api.json");

/// The admin listener's document: the admin API, health and metrics.
pub const ADMIN_DOCUMENT: &[u8] = include_bytes!("../../../docs/openapi/admin.json");

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;
    use sortie_core::error::{ErrorCode, TimeoutType};
    use sortie_core::limits::*;
    use sortie_core::receipt::MAX_PART_NUMBER;

    fn doc(bytes: &[u8]) -> Value {
        serde_json::from_slice(bytes).expect("the document is JSON")
    }

    fn strings(v: &Value) -> Vec<String> {
        v.as_array()
            .expect("an array")
            .iter()
            .map(|s| s.as_str().expect("a string").to_string())
            .collect()
    }

    fn num(v: &Value) -> u64 {
        v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
    }

    #[test]
    fn error_schema_lists_the_registry() {
        let d = doc(API_DOCUMENT);
        let e = &d["components"]["schemas"]["Error"]["properties"];
        let codes: Vec<String> = ErrorCode::ALL.iter().map(|c| c.as_str().into()).collect();
        assert_eq!(strings(&e["code"]["enum"]), codes);
        let mut categories: Vec<String> = ErrorCode::ALL
            .iter()
            .map(|c| c.category().as_str().to_string())
            .collect();
        categories.dedup();
        categories.sort();
        categories.dedup();
        let mut documented = strings(&e["category"]["enum"]);
        documented.sort();
        assert_eq!(documented, categories);
        let timeouts: Vec<String> = TimeoutType::ALL.iter().map(|t| t.as_str().into()).collect();
        assert_eq!(strings(&e["timeout_type"]["enum"]), timeouts);
        // Every status an error code answers with is a documented response of the request API.
        let responses = &d["paths"]["/api/v1/requests"]["post"]["responses"];
        for c in ErrorCode::ALL {
            let r = &responses[c.http_status().to_string()];
            assert!(
                r.is_object(),
                "{} answers {} undocumented",
                c.as_str(),
                c.http_status()
            );
            let desc = r["description"].as_str().unwrap_or_default();
            assert!(desc.contains(&format!("`{}`", c.as_str())), "{desc}");
        }
    }

    #[test]
    fn request_envelope_limits_are_the_enforced_ones() {
        let d = doc(API_DOCUMENT);
        let s = &d["components"]["schemas"];
        let env = &s["RequestEnvelope"]["properties"];
        assert_eq!(num(&env["headers"]["maxItems"]), MAX_HEADERS as u64);
        assert_eq!(num(&env["url"]["maxLength"]), MAX_URL_BYTES as u64);
        assert_eq!(num(&env["timeout_ms"]["minimum"]), MIN_TIMEOUT_MS);
        assert_eq!(
            num(&env["fingerprint_profile"]["maxLength"]),
            MAX_PROFILE_NAME_BYTES as u64
        );
        let desc = env["headers"]["description"].as_str().unwrap_or_default();
        assert!(
            desc.contains(&format!("{MAX_HEADER_NAME_BYTES} bytes")),
            "{desc}"
        );
        let total = MAX_HEADER_TOTAL_BYTES.to_string();
        let grouped = format!(
            "{},{}",
            &total[..total.len() - 3],
            &total[total.len() - 3..]
        );
        assert!(desc.contains(&grouped), "{desc}");
        assert_eq!(
            num(&s["Header"]["properties"]["name"]["maxLength"]),
            MAX_HEADER_NAME_BYTES as u64
        );
        let routing = &s["Routing"]["properties"];
        assert_eq!(num(&routing["tags"]["maxItems"]), MAX_ROUTING_TAGS as u64);
        assert_eq!(
            num(&routing["tags"]["items"]["maxLength"]),
            MAX_ROUTING_TAG_BYTES as u64
        );
        for field in ["region", "ip_type"] {
            assert_eq!(
                num(&routing[field]["maxLength"]),
                MAX_ROUTING_FIELD_BYTES as u64
            );
        }
        assert_eq!(
            num(&routing["sticky_session_id"]["maxLength"]),
            MAX_STICKY_SESSION_ID_BYTES as u64
        );
        let desc = env_description(&s["RequestEnvelope"]);
        assert!(
            desc.contains(&format!("{} MiB", MAX_REQUEST_ENVELOPE_BYTES >> 20)),
            "{desc}"
        );
        let part = &d["paths"]["/api/v1/receipts/{id}/parts/{part}"]["parameters"][1];
        assert_eq!(num(&part["schema"]["maximum"]), u64::from(MAX_PART_NUMBER));
    }

    /// The document lists every name a request may give: each built-in profile's name and
    /// aliases, the moving ones included (`scripts/record-profiles.py` writes the list).
    #[test]
    fn the_profile_names_are_the_built_in_ones() {
        use sortie_core::fingerprint::profile::PROFILES;
        let d = doc(API_DOCUMENT);
        let env = &d["components"]["schemas"]["RequestEnvelope"]["properties"];
        let mut documented = strings(&env["fingerprint_profile"]["enum"]);
        documented.sort();
        let mut names: Vec<String> = PROFILES
            .iter()
            .flat_map(|p| std::iter::once(p.name).chain(p.all_aliases()))
            .map(String::from)
            .collect();
        names.sort();
        assert_eq!(documented, names);
    }

    fn env_description(v: &Value) -> &str {
        v["description"].as_str().unwrap_or_default()
    }

    #[test]
    fn admin_document_names_the_admin_errors_and_body_limit() {
        let d = doc(ADMIN_DOCUMENT);
        let put = &d["paths"]["/api/v1/admin/config"]["put"];
        let desc = put["requestBody"]["description"]
            .as_str()
            .unwrap_or_default();
        assert!(
            desc.contains(&format!("{} MiB", MAX_ADMIN_BODY_BYTES >> 20)),
            "{desc}"
        );
        for (status, error) in [
            ("401", "admin_auth_required"),
            ("428", "if_match_required"),
            ("400", "invalid_if_match"),
            ("422", "invalid_snapshot"),
        ] {
            assert_eq!(
                put["responses"][status]["content"]["application/json"]["example"]["error"],
                error
            );
        }
        assert_eq!(
            d["paths"]["/api/v1/admin/requests/{request_id}"]["delete"]["responses"]["404"]
                ["content"]["application/json"]["example"]["error"],
            "request_not_found"
        );
    }
}
