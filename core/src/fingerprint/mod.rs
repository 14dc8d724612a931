//! Browser fingerprints: the built-in profiles (`profile.rs`: data, with their expected strings)
//! whose names a request may give exactly (case-sensitive; a worker serves one only when it
//! advertises the profile after its self-test), and the
//! sans-IO computation of the fingerprints a loopback capture compares with a profile's
//! expected strings: JA4, JA4_r and JA3N from a ClientHello (`client_hello.rs`, `tls.rs`) and
//! the Akamai HTTP/2 string from a client's first frames (`http2.rs`).

pub mod client_hello;
pub mod http2;
pub mod profile;
pub mod tls;

/// The built-in profile names, in the order `sortie fingerprints` lists them: the names of
/// [`profile::PROFILES`], as a list of names request validation can hold.
pub const BUILTIN_PROFILES: &[&str] = profile::NAMES;

/// Whether `name` is exactly a built-in profile name (not an alias).
pub fn is_builtin(name: &str) -> bool {
    BUILTIN_PROFILES.contains(&name)
}

/// The built-in profile name that `name` stands for: itself, or the profile an alias names
/// ([`profile::resolve`]). What a request asks for is always held and matched by this name.
pub fn canonical(name: &str) -> Option<&'static str> {
    profile::resolve(name).map(|p| p.name)
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
        let names: Vec<&str> = profile::PROFILES.iter().map(|p| p.name).collect();
        assert_eq!(names, BUILTIN_PROFILES);
    }
}
