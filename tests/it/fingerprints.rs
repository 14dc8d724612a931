//! `sortie fingerprints` and fingerprinted requests through a real `sortie serve`: the list and
//! the self-test of the built binary (a build without feature `fingerprints` lists none and
//! says why), and with the feature a request naming a profile reaching the loopback capture
//! server with the profile's JA4, JA4_r, JA3N and Akamai strings (decisions 081, 082).

use crate::support;

use std::process::Command;

use serde_json::json;
use support::gateway::{request_api, Gateway};

fn sortie(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_sortie"))
        .args(args)
        .output()
        .expect("sortie runs");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[test]
fn the_list_names_every_profile_or_says_why_there_is_none() {
    let (ok, out) = sortie(&["fingerprints"]);
    assert!(ok, "{out}");
    if cfg!(feature = "fingerprints") {
        for p in sortie_core::fingerprint::profile::PROFILES {
            assert!(out.contains(&format!("{}\t{}", p.name, p.browser)), "{out}");
            assert!(out.contains(p.expected.ja4), "{out}");
            assert!(out.contains(p.expected.ja4_r), "{out}");
            assert!(out.contains(p.expected.ja3n), "{out}");
            assert!(out.contains(p.expected.akamai), "{out}");
            let aliases: Vec<&str> = p.all_aliases().collect();
            if !aliases.is_empty() {
                assert!(out.contains(&aliases.join(", ")), "{out}");
            }
        }
        // The moving aliases name the newest profile of each family.
        assert!(out.contains("aliases chrome146, chrome\n"), "{out}");
        assert!(out.contains("aliases safari2601, safari\n"), "{out}");
    } else {
        assert!(out.contains("no built-in profiles"), "{out}");
        assert!(out.contains("--features fingerprints"), "{out}");
    }
}

#[test]
fn verify_passes_every_profile_or_fails_without_the_connector() {
    let (ok, out) = sortie(&["fingerprints", "--verify"]);
    if cfg!(feature = "fingerprints") {
        assert!(ok, "{out}");
        let all = sortie_core::fingerprint::profile::PROFILES;
        let n = all.iter().filter(|p| p.unsupported.is_none()).count();
        assert!(n >= 40, "{n}");
        assert!(out.contains(&format!("{n} passed, 0 failed")), "{out}");
        for p in all {
            match p.unsupported {
                None => assert!(out.contains(&format!("{}\tpass", p.name)), "{out}"),
                Some(why) => {
                    assert!(
                        out.contains(&format!("{}\tnot available: {why}", p.name)),
                        "{out}"
                    )
                }
            }
            assert!(
                out.contains(p.expected.ja3n) || p.unsupported.is_some(),
                "{out}"
            );
        }
    } else {
        assert!(!ok, "{out}");
        assert!(out.contains("no built-in profiles"), "{out}");
    }
}

#[test]
fn an_unknown_profile_name_is_an_invalid_request() {
    let gw = Gateway::start();
    for name in [
        "chrome_999",
        "Chrome_131",
        "",
        "Chrome",
        "chrome131 ",
        "safari_26_0_1_ios",
    ] {
        let r = request_api(
            &gw,
            &json!({"method": "GET", "url": "https://localhost:9/", "fingerprint_profile": name}),
        );
        assert_eq!(r.status, 400, "{}", r.text());
        let v: serde_json::Value = serde_json::from_slice(&r.body).expect("json");
        assert_eq!(v["code"], "invalid_request", "{v}");
    }
}

/// Every profile through the request API reaches the capture server as the profile says; the
/// local worker advertises them (admin API).
#[cfg(feature = "fingerprints")]
#[test]
fn a_request_naming_a_profile_leaves_with_that_profile() {
    use sortie_io::egress::fingerprint::{capture::CaptureServer, compare};
    use std::time::Duration;
    use support::gateway::{admin, temp_dir};

    let server = CaptureServer::start().expect("capture server");
    let dir = temp_dir("fp");
    let ca = dir.join("capture-ca.pem");
    std::fs::write(&ca, server.ca_pem()).expect("CA written");
    let gw = Gateway::builder()
        .dir(dir.clone())
        .section(&format!(
            "[egress]\nca_file = {:?}\n",
            ca.display().to_string()
        ))
        .start();
    let r = admin(&gw, "GET", "/api/v1/admin/workers", &[], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    let workers: serde_json::Value = serde_json::from_slice(&r.body).expect("json");
    let advertised = workers.to_string();
    for p in sortie_core::fingerprint::profile::PROFILES {
        let named = advertised.contains(&format!("\"{}\"", p.name));
        assert_eq!(named, p.unsupported.is_none(), "{}: {advertised}", p.name);
    }
    let url = format!("https://localhost:{}/", server.addr().port());
    let send = |name: &str| {
        request_api(
            &gw,
            &json!({"method": "GET", "url": url, "fingerprint_profile": name,
                    "headers": [{"name": "accept", "value_base64": "Ki8q"},
                                {"name": "user-agent", "value_base64": "dGVzdA=="}]}),
        )
    };
    // A profile this build cannot send is a known name that no worker advertises.
    for p in sortie_core::fingerprint::profile::PROFILES
        .iter()
        .filter(|p| p.unsupported.is_some())
    {
        let r = send(p.name);
        assert_eq!(r.status, 400, "{}: {}", p.name, r.text());
        let v: serde_json::Value = serde_json::from_slice(&r.body).expect("json");
        assert_eq!(v["code"], "unsupported_fingerprint", "{v}");
    }
    // An alias (curl_cffi's target name, a moving family name) leaves as its profile.
    for (alias, name) in [
        ("chrome", "chrome_146"),
        ("safari2601", "safari_26_0_1"),
        ("okhttp4", "okhttp_4_12"),
    ] {
        let p = sortie_core::fingerprint::profile::by_name(name).expect("a profile");
        let r = send(alias);
        assert_eq!(r.status, 200, "{alias}: {}", r.text());
        let c = server.next(Duration::from_secs(10)).expect("a capture");
        assert_eq!(compare(p, &c), Vec::<String>::new(), "{alias}");
    }
    for p in sortie_core::fingerprint::profile::PROFILES
        .iter()
        .filter(|p| p.unsupported.is_none())
    {
        let r = send(p.name);
        assert_eq!(r.status, 200, "{}: {}", p.name, r.text());
        let v: serde_json::Value = serde_json::from_slice(&r.body).expect("json");
        assert_eq!(v["status"], 200, "{v}");
        let c = server.next(Duration::from_secs(10)).expect("a capture");
        assert_eq!(compare(p, &c), Vec::<String>::new(), "{}", p.name);
    }
}
