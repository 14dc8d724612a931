//! Browser fingerprints: the built-in profile names a request may name exactly (case-sensitive;
//! a worker serves one only when it advertises the profile after its self-test), and the
//! sans-IO computation of the fingerprints a loopback capture compares with a profile's
//! expected strings: JA4, JA4_r and JA3N from a ClientHello (`client_hello.rs`, `tls.rs`) and
//! the Akamai HTTP/2 string from a client's first frames (`http2.rs`).

pub mod client_hello;
pub mod http2;
pub mod tls;

/// The built-in profile names, in the order `sortie fingerprints` lists them.
pub const BUILTIN_PROFILES: &[&str] = &["chrome_131", "firefox_133"];

/// Whether `name` is exactly a built-in profile name.
pub fn is_builtin(name: &str) -> bool {
    BUILTIN_PROFILES.contains(&name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_exact() {
        assert!(is_builtin("chrome_131"));
        assert!(!is_builtin("Chrome_131"));
        assert!(!is_builtin("chrome_131 "));
        assert!(!is_builtin(""));
    }
}
