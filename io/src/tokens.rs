//! Bearer tokens: resolving them from the configuration or the environment, generating and
//! keeping them in the data directory on first start, and checking presented tokens in constant
//! time.

use std::collections::HashMap;
use std::fs;
use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ring::digest;
use sortie_core::config::{Config, SecretRef, DEFAULT_DEPLOYMENT_ID};
use subtle::ConstantTimeEq as _;

/// File name of the generated tokens inside the data directory.
pub const TOKENS_FILE: &str = "tokens.toml";

/// A reload that adds, removes or reorders deployments, which takes a restart: their positions
/// index per-deployment limits and counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the deployments differ (ids or order): that needs a restart")]
pub struct DeploymentsChanged;

/// Why tokens could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// A `token_env` names a variable that is unset or empty.
    #[error("{path}.token_env: environment variable {var} is not set")]
    MissingEnv {
        /// Key path of the secret.
        path: String,
        /// The variable.
        var: String,
    },
    /// The tokens file could not be read or written.
    #[error("{path}: {error}")]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        error: String,
    },
    /// Two secrets that must differ are the same token: two deployments (a request could not
    /// tell which it is), or a deployment and the admin API (a deployment could administer
    /// the gateway). Names the keys, never the token.
    #[error("{first} and {second} have the same token: give each its own")]
    Shared {
        /// Key path of the first.
        first: String,
        /// Key path of the second.
        second: String,
    },
}

/// Refuses tokens shared between deployments, or between a deployment and the admin API
/// (compared in constant time; the error names keys only).
fn check_distinct(deployments: &[(String, String)], admin: &str) -> Result<(), TokenError> {
    let key = |i: usize| {
        let id = deployments.get(i).map(|(id, _)| id.as_str()).unwrap_or("");
        format!("deployments[{i}] ({id})")
    };
    for (i, (_, a)) in deployments.iter().enumerate() {
        if token_matches(admin, a.as_bytes()) {
            return Err(TokenError::Shared {
                first: key(i),
                second: "admin".into(),
            });
        }
        for (j, (_, b)) in deployments.iter().enumerate().skip(i + 1) {
            if token_matches(a, b.as_bytes()) {
                return Err(TokenError::Shared {
                    first: key(i),
                    second: key(j),
                });
            }
        }
    }
    Ok(())
}

/// Tokens in force for this process.
pub struct ResolvedTokens {
    /// (deployment id, token) pairs.
    pub deployments: Vec<(String, String)>,
    /// The admin token.
    pub admin: String,
    /// Where generated tokens are kept, when any were generated or read from there.
    pub file: Option<PathBuf>,
    /// Whether the file was created by this start (its tokens are then printed once).
    pub is_new_file: bool,
}

#[derive(serde::Deserialize, serde::Serialize, Default)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    #[serde(default)]
    admin: Option<String>,
    #[serde(default)]
    deployments: std::collections::BTreeMap<String, String>,
}

fn random_token(prefix: &str, file: &Path) -> Result<String, TokenError> {
    use base64::Engine as _;
    use ring::rand::SecureRandom as _;
    let mut b = [0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut b)
        .map_err(|_| TokenError::File {
            path: file.to_path_buf(),
            error: "the operating system's random number generator failed".into(),
        })?;
    Ok(format!(
        "{prefix}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
    ))
}

/// Bytes of OS randomness drawn at once for ids: one `getrandom` per 256 request ids instead of
/// one per request.
const ID_RANDOM_BATCH: usize = 4096;

thread_local! {
    static ID_RANDOM: std::cell::RefCell<(Vec<u8>, usize)> =
        const { std::cell::RefCell::new((Vec::new(), 0)) };
}

/// `N` bytes of OS randomness for request and receipt ids, served from a per-thread batch.
pub fn random_bytes<const N: usize>() -> [u8; N] {
    use ring::rand::SecureRandom as _;
    let mut out = [0u8; N];
    let served = ID_RANDOM.with(|cell| {
        let mut st = cell.borrow_mut();
        let (buf, pos) = &mut *st;
        if N > ID_RANDOM_BATCH {
            return false;
        }
        if buf.len() != ID_RANDOM_BATCH || *pos + N > buf.len() {
            buf.resize(ID_RANDOM_BATCH, 0);
            if ring::rand::SystemRandom::new().fill(buf).is_err() {
                buf.clear();
                return false;
            }
            *pos = 0;
        }
        out.copy_from_slice(&buf[*pos..*pos + N]);
        // Served bytes are wiped so that they exist once.
        buf[*pos..*pos + N].fill(0);
        *pos += N;
        true
    });
    if !served {
        // Ids only need to be unique, not secret: fall back to time and a counter.
        use std::sync::atomic::{AtomicU64, Ordering};
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let c = COUNTER.fetch_add(1, Ordering::Relaxed);
        for (i, x) in t
            .to_le_bytes()
            .iter()
            .chain(c.to_le_bytes().iter())
            .enumerate()
        {
            if i < N {
                out[i] = *x;
            }
        }
    }
    out
}

pub(crate) fn from_secret(path: &str, s: &SecretRef) -> Result<Option<String>, TokenError> {
    if let Some(t) = &s.token {
        return Ok(Some(t.clone()));
    }
    if let Some(var) = &s.token_env {
        return match std::env::var(var) {
            Ok(v) if !v.is_empty() => Ok(Some(v)),
            _ => Err(TokenError::MissingEnv {
                path: path.into(),
                var: var.clone(),
            }),
        };
    }
    Ok(None)
}

/// Resolves every token of `config`: configured ones from the file or environment; missing ones
/// (no `[[deployments]]`, no `[admin]` token) from `<data_dir>/tokens.toml`, generated there with
/// mode 0600 on first start.
pub fn resolve(config: &Config, data_dir: &Path) -> Result<ResolvedTokens, TokenError> {
    let mut deployments = Vec::new();
    for (i, d) in config.deployments.iter().enumerate() {
        let path = format!("deployments[{i}]");
        if let Some(t) = from_secret(&path, &d.secret)? {
            deployments.push((d.id.clone(), t));
        }
    }
    let admin = from_secret("admin", &config.admin.secret)?;
    if let (false, Some(admin)) = (deployments.is_empty(), &admin) {
        check_distinct(&deployments, admin)?;
        return Ok(ResolvedTokens {
            deployments,
            admin: admin.clone(),
            file: None,
            is_new_file: false,
        });
    }

    let file = data_dir.join(TOKENS_FILE);
    let ferr = |e: String| TokenError::File {
        path: file.clone(),
        error: e,
    };
    let mut stored: TokensFile = match fs::read_to_string(&file) {
        Ok(text) => toml::from_str(&text).map_err(|e| ferr(e.message().to_string()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => TokensFile::default(),
        Err(e) => return Err(ferr(e.to_string())),
    };
    let mut changed = false;
    if deployments.is_empty() {
        let t = match stored.deployments.get(DEFAULT_DEPLOYMENT_ID) {
            Some(t) => t.clone(),
            None => {
                let t = random_token("sdt_", &file)?;
                stored
                    .deployments
                    .insert(DEFAULT_DEPLOYMENT_ID.to_string(), t.clone());
                changed = true;
                t
            }
        };
        deployments.push((DEFAULT_DEPLOYMENT_ID.to_string(), t));
    }
    let admin = match (admin, &stored.admin) {
        (Some(a), _) => a,
        (None, Some(a)) => a.clone(),
        (None, None) => {
            let a = random_token("sat_", &file)?;
            stored.admin = Some(a.clone());
            changed = true;
            a
        }
    };
    check_distinct(&deployments, &admin)?;
    let is_new_file = changed;
    if changed {
        write_private(&file, &stored).map_err(|e| ferr(e.to_string()))?;
    }
    Ok(ResolvedTokens {
        deployments,
        admin,
        file: Some(file),
        is_new_file,
    })
}

fn write_private(file: &Path, t: &TokensFile) -> std::io::Result<()> {
    let body = toml::to_string(t).map_err(std::io::Error::other)?;
    let tmp = file.with_extension("toml.tmp");
    let _ = fs::remove_file(&tmp);
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(b"# Sortie bearer tokens, generated on first start. Keep this file secret.\n")?;
    f.write_all(body.as_bytes())?;
    f.sync_all()?;
    fs::rename(&tmp, file)?;
    fs::set_permissions(file, fs::Permissions::from_mode(0o600))?;
    Ok(())
}

/// Shows the start of a token, for the log line of later starts.
pub fn redact(token: &str) -> String {
    let keep: String = token.chars().take(8).collect();
    format!("{keep}…")
}

/// Extracts the token of an `Authorization: Bearer <token>` value (RFC 6750 §2.1; the scheme
/// is case-insensitive).
pub fn bearer(value: &[u8]) -> Option<&[u8]> {
    let v = value.trim_ascii();
    if v.len() < 7 || !v[..7].eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    let t = v[7..].trim_ascii_start();
    (!t.is_empty()).then_some(t)
}

/// Checks presented deployment tokens. Lookup is by SHA-256 digest of the token, then the full
/// token is compared in constant time, so neither step leaks the stored token through timing.
pub struct Authenticator {
    /// The tokens, replaced whole by a reload (decision 114).
    tokens: arc_swap::ArcSwap<Tokens>,
    ids: Vec<Arc<str>>,
}

/// One generation of deployment tokens.
struct Tokens {
    /// Token digest to (index into `ids`, token).
    by_digest: HashMap<[u8; 32], (usize, Vec<u8>)>,
    /// Counts replacements: what was authenticated under an older one is checked again.
    generation: u64,
}

impl Tokens {
    fn new(tokens: &[(String, String)], generation: u64) -> Tokens {
        let by_digest = tokens
            .iter()
            .enumerate()
            .map(|(i, (_, t))| (sha256(t.as_bytes()), (i, t.as_bytes().to_vec())))
            .collect();
        Tokens {
            by_digest,
            generation,
        }
    }
}

/// A deployment an [`Authenticator`] authenticated: a small copyable handle, resolved to its id
/// with [`Authenticator::id`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeploymentRef(usize);

impl DeploymentRef {
    /// The deployment's position in the configuration, below [`Authenticator::len`].
    pub fn index(self) -> usize {
        self.0
    }
}

fn sha256(b: &[u8]) -> [u8; 32] {
    let d = digest::digest(&digest::SHA256, b);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

impl Authenticator {
    /// Builds the table from (deployment id, token) pairs.
    pub fn new(tokens: &[(String, String)]) -> Authenticator {
        let ids = tokens
            .iter()
            .map(|(id, _)| Arc::from(id.as_str()))
            .collect();
        Authenticator {
            tokens: arc_swap::ArcSwap::from_pointee(Tokens::new(tokens, 0)),
            ids,
        }
    }

    /// The deployment a presented token belongs to.
    pub fn authenticate(&self, token: &[u8]) -> Option<DeploymentRef> {
        let tokens = self.tokens.load();
        let (i, stored) = tokens.by_digest.get(&sha256(token))?;
        secrets_equal(stored, token).then_some(DeploymentRef(*i))
    }

    /// The generation of the tokens: it changes with every [`Authenticator::replace_tokens`],
    /// so a cache of authenticated credentials knows to check them again.
    pub fn generation(&self) -> u64 {
        self.tokens.load().generation
    }

    /// Replaces the deployments' tokens (a reload, decision 114). The deployments must be the
    /// same, in the same order: their positions index per-deployment limits and counters.
    pub fn replace_tokens(&self, tokens: &[(String, String)]) -> Result<(), DeploymentsChanged> {
        let same = tokens.len() == self.ids.len()
            && tokens
                .iter()
                .zip(&self.ids)
                .all(|((id, _), old)| id.as_str() == &**old);
        if !same {
            return Err(DeploymentsChanged);
        }
        let generation = self.generation().wrapping_add(1);
        self.tokens
            .store(std::sync::Arc::new(Tokens::new(tokens, generation)));
        Ok(())
    }

    /// Number of deployments.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether no deployment is configured.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The id of an authenticated deployment.
    pub fn id(&self, d: DeploymentRef) -> &str {
        self.ids.get(d.0).map_or("", |id| id)
    }

    /// The deployment's id, shared: for what outlives the borrow (the core's active list).
    pub fn shared_id(&self, d: DeploymentRef) -> Arc<str> {
        self.ids.get(d.0).cloned().unwrap_or_else(|| Arc::from(""))
    }
}

/// Whether two secrets are equal, in time that depends on their length only: eight bytes at a
/// time with `subtle`'s word comparison, then the tail byte by byte. A length that differs
/// answers at once, as `subtle`'s slice comparison does (a length is not the secret).
/// `subtle` compares a slice byte by byte behind an optimisation barrier each, about eight
/// times the instructions for a credential of 40 bytes, on every request.
pub fn secrets_equal(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let (a_words, a_tail) = a.as_chunks::<8>();
    let (b_words, b_tail) = b.as_chunks::<8>();
    let words = a_words
        .iter()
        .zip(b_words)
        .fold(subtle::Choice::from(1), |eq, (x, y)| {
            eq & u64::from_ne_bytes(*x).ct_eq(&u64::from_ne_bytes(*y))
        });
    bool::from(words & a_tail.ct_eq(b_tail))
}

/// Compares a presented token with the expected one in constant time.
pub fn token_matches(expected: &str, presented: &[u8]) -> bool {
    bool::from(sha256(expected.as_bytes()).ct_eq(&sha256(presented)))
        && secrets_equal(expected.as_bytes(), presented)
}

#[cfg(test)]
mod tests {

    #[test]
    fn secrets_equal_only_when_every_byte_is() {
        let a: Vec<u8> = (0..41u8).map(|i| i.wrapping_mul(37) ^ 0x5a).collect();
        for len in 0..=a.len() {
            let x = &a[..len];
            assert!(super::secrets_equal(x, x));
            assert!(!super::secrets_equal(x, &a[..len.saturating_sub(1)]) || len == 0);
            for at in 0..len {
                for bit in [0x01u8, 0x80] {
                    let mut y = x.to_vec();
                    y[at] ^= bit;
                    assert!(!super::secrets_equal(x, &y), "len {len}, byte {at}");
                }
            }
        }
    }

    #[test]
    fn replaced_tokens_apply_at_once_and_only_for_the_same_deployments() {
        let a = Authenticator::new(&[
            ("dep_a".into(), "token-a-0123456789".into()),
            ("dep_b".into(), "token-b-0123456789".into()),
        ]);
        let g = a.generation();
        assert!(a
            .replace_tokens(&[("dep_b".into(), "x-0123456789abcdef".into())])
            .is_err());
        assert!(a
            .replace_tokens(&[
                ("dep_b".into(), "token-b-0123456789".into()),
                ("dep_a".into(), "token-a-0123456789".into()),
            ])
            .is_err());
        assert_eq!(a.generation(), g, "a refused replacement changes nothing");
        a.replace_tokens(&[
            ("dep_a".into(), "token-a-new-0123456789".into()),
            ("dep_b".into(), "token-b-0123456789".into()),
        ])
        .unwrap();
        assert_ne!(a.generation(), g);
        assert!(a.authenticate(b"token-a-0123456789").is_none());
        let d = a.authenticate(b"token-a-new-0123456789").unwrap();
        assert_eq!(a.id(d), "dep_a");
        assert_eq!(
            a.id(a.authenticate(b"token-b-0123456789").unwrap()),
            "dep_b"
        );
    }

    use super::*;

    #[test]
    fn random_ids_do_not_repeat() {
        let mut seen = std::collections::HashSet::new();
        for _ in 0..2000 {
            assert!(seen.insert(random_bytes::<16>()));
        }
    }

    #[test]
    fn bearer_parsing() {
        assert_eq!(bearer(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer(b"bearer   abc "), Some(&b"abc"[..]));
        assert_eq!(bearer(b"Basic abc"), None);
        assert_eq!(bearer(b"Bearer "), None);
        assert_eq!(bearer(b"Bearerabc"), None);
    }

    #[test]
    fn authenticator() {
        let a = Authenticator::new(&[
            ("d1".into(), "tok-one".into()),
            ("d2".into(), "tok-two".into()),
        ]);
        let deployment = |t: &[u8]| a.authenticate(t).map(|d| a.id(d));
        assert_eq!(deployment(b"tok-one"), Some("d1"));
        assert_eq!(deployment(b"tok-two"), Some("d2"));
        assert_eq!(deployment(b"tok-on"), None);
        assert_eq!(deployment(b""), None);
        assert!(token_matches("admin-x", b"admin-x"));
        assert!(!token_matches("admin-x", b"admin-y"));
    }

    #[test]
    fn generated_once_and_private() {
        let dir = std::env::temp_dir().join(format!("sortie-tok-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let c = Config::embedded_default();
        let a = resolve(&c, &dir).unwrap();
        assert!(a.is_new_file);
        assert_eq!(a.deployments[0].0, DEFAULT_DEPLOYMENT_ID);
        assert!(a.deployments[0].1.starts_with("sdt_"));
        assert!(a.admin.starts_with("sat_"));
        let mode = fs::metadata(dir.join(TOKENS_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let b = resolve(&c, &dir).unwrap();
        assert!(!b.is_new_file);
        assert_eq!(a.deployments, b.deployments);
        assert_eq!(a.admin, b.admin);
        let _ = fs::remove_dir_all(&dir);
    }

    /// Two deployments with one token, or a deployment with the admin token, are refused at
    /// start once the environment's tokens are resolved (the file's own are compared by the
    /// configuration already); the message names the keys and never the token.
    #[test]
    fn shared_tokens_are_refused_and_not_shown() {
        let var = |n: &str| format!("SORTIE_TEST_SHARED_TOKEN_{}_{n}", std::process::id());
        std::env::set_var(var("A"), "tok-shared-1234567890");
        std::env::set_var(var("B"), "tok-shared-1234567890");
        std::env::set_var(var("C"), "tok-other-1234567890");
        let dep = |id: &str, v: &str| {
            format!(
                "[[deployments]]\nid = \"{id}\"\ntoken_env = \"{}\"\n",
                var(v)
            )
        };
        let admin = |v: &str| format!("[admin]\ntoken_env = \"{}\"\n", var(v));
        for (toml, first, second) in [
            (
                dep("a", "A") + &dep("b", "B") + &admin("C"),
                "deployments[0] (a)",
                "deployments[1] (b)",
            ),
            (
                dep("a", "C") + &dep("b", "A") + &admin("B"),
                "deployments[1] (b)",
                "admin",
            ),
        ] {
            let c = Config::from_toml(&toml).unwrap();
            let e = resolve(&c, Path::new("/nonexistent"))
                .err()
                .expect("refused");
            let text = e.to_string();
            assert!(text.contains(first) && text.contains(second), "{text}");
            assert!(!text.contains("tok-shared"), "{text}");
        }
        let c = Config::from_toml(&(dep("a", "A") + &admin("C"))).unwrap();
        assert!(resolve(&c, Path::new("/nonexistent")).is_ok());
    }

    #[test]
    fn missing_env_names_the_key() {
        let c = Config::from_toml(
            "[[deployments]]\nid = \"d\"\ntoken_env = \"SORTIE_TEST_SURELY_UNSET_VAR\"",
        )
        .unwrap();
        let e = resolve(&c, Path::new("/nonexistent")).err().unwrap();
        assert!(e.to_string().starts_with("deployments[0].token_env"), "{e}");
    }
}
