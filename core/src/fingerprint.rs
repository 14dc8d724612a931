//! Built-in fingerprint profile names. A request may name one of these exactly (case-sensitive);
//! a worker serves it only when it advertises the profile after its self-test.

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
