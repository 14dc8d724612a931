//! Built-in browser profiles as data: the ClientHello parameters and HTTP/2 behaviour a
//! fingerprinted connection reproduces, the order it puts the caller's headers in, and the
//! strings a capture of it must give (JA4, JA4_r, JA3N, Akamai). The IO shell turns a profile
//! into BoringSSL and `http2` settings; the loopback self-test compares what it captured with
//! [`Expected`] (decision 081 says where the values come from).
//!
//! Every list is without GREASE values: whether GREASE is sent is [`TlsProfile::grease`].

use super::client_hello::ClientHello;

/// TLS 1.3 and 1.2 as `supported_versions` lists them.
pub const TLS13: u16 = 0x0304;
/// TLS 1.2.
pub const TLS12: u16 = 0x0303;

/// Extension code points a profile may list (IANA names).
pub mod ext {
    /// server_name.
    pub const SERVER_NAME: u16 = 0;
    /// status_request (OCSP stapling).
    pub const STATUS_REQUEST: u16 = 5;
    /// supported_groups.
    pub const SUPPORTED_GROUPS: u16 = 10;
    /// ec_point_formats.
    pub const EC_POINT_FORMATS: u16 = 11;
    /// signature_algorithms.
    pub const SIGNATURE_ALGORITHMS: u16 = 13;
    /// application_layer_protocol_negotiation.
    pub const ALPN: u16 = 16;
    /// signed_certificate_timestamp.
    pub const SCT: u16 = 18;
    /// extended_master_secret.
    pub const EXTENDED_MASTER_SECRET: u16 = 23;
    /// compress_certificate.
    pub const COMPRESS_CERTIFICATE: u16 = 27;
    /// record_size_limit.
    pub const RECORD_SIZE_LIMIT: u16 = 28;
    /// delegated_credentials.
    pub const DELEGATED_CREDENTIALS: u16 = 34;
    /// session_ticket.
    pub const SESSION_TICKET: u16 = 35;
    /// supported_versions.
    pub const SUPPORTED_VERSIONS: u16 = 43;
    /// psk_key_exchange_modes.
    pub const PSK_KEY_EXCHANGE_MODES: u16 = 45;
    /// key_share.
    pub const KEY_SHARE: u16 = 51;
    /// application_settings (ALPS), the code point Chrome used until version 132.
    pub const ALPS_OLD: u16 = 17513;
    /// application_settings (ALPS), the code point of Chrome 133 and later.
    pub const ALPS_NEW: u16 = 17613;
    /// encrypted_client_hello (sent as GREASE).
    pub const ECH: u16 = 65037;
    /// renegotiation_info.
    pub const RENEGOTIATION_INFO: u16 = 65281;
}

/// Certificate compression algorithms (RFC 8879).
pub mod cert_compression {
    /// zlib.
    pub const ZLIB: u16 = 1;
    /// brotli.
    pub const BROTLI: u16 = 2;
    /// zstd.
    pub const ZSTD: u16 = 3;
}

/// A built-in profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Profile {
    /// The name a request gives in `fingerprint_profile` (exact, case-sensitive).
    pub name: &'static str,
    /// The browser and version it reproduces, for people.
    pub browser: &'static str,
    /// The family (`chrome`, `safari_ios`, ...): the family's name is a moving alias of its
    /// newest profile.
    pub family: &'static str,
    /// The browser version, dotted numbers; orders a family.
    pub version: &'static str,
    /// Other exact names of this profile (curl_cffi's target names).
    pub aliases: &'static [&'static str],
    /// Where the parameters and expected strings come from.
    pub source: &'static str,
    /// Why the linked BoringSSL cannot send this profile's ClientHello, when it cannot: the
    /// profile is listed with the reason, its data and expected strings stay checked, but no
    /// process advertises it (a request naming it gets `unsupported_fingerprint`) and no
    /// moving alias points to it (decision 100).
    pub unsupported: Option<&'static str>,
    /// The ClientHello.
    pub tls: TlsProfile,
    /// The HTTP/2 connection start and request framing.
    pub http2: Http2Profile,
    /// Lowercase header names in the order the browser sends them: the caller's headers with
    /// these names go first, in this order, the rest after them in the caller's order. The
    /// profile adds no header of its own.
    pub header_order: &'static [&'static str],
    /// What a capture of a connection with this profile must give.
    pub expected: Expected,
}

/// The ClientHello parameters of a profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TlsProfile {
    /// Cipher suites in wire order.
    pub ciphers: &'static [u16],
    /// Whether GREASE values lead the cipher, group, key share, version and extension lists.
    pub grease: bool,
    /// Supported groups in order.
    pub groups: &'static [u16],
    /// Groups a key share is sent for, in order.
    pub key_shares: &'static [u16],
    /// Signature algorithms in wire order.
    pub signature_algorithms: &'static [u16],
    /// Versions in `supported_versions`, highest first.
    pub versions: &'static [u16],
    /// ALPN protocols in order.
    pub alpn: &'static [&'static str],
    /// The extensions sent (when a server name is given). In wire order unless
    /// [`TlsProfile::permute_extensions`].
    pub extensions: &'static [u16],
    /// Whether the extension order is shuffled per connection, as Chrome does since 110.
    pub permute_extensions: bool,
    /// Certificate compression algorithms offered, in order.
    pub cert_compression: &'static [u16],
    /// Signature algorithms of `delegated_credentials`, when sent.
    pub delegated_credentials: &'static [u16],
    /// The `record_size_limit` value, when sent.
    pub record_size_limit: Option<u16>,
    /// Whether the padding extension comes and goes between connections (BoringSSL pads a
    /// ClientHello of 256–511 bytes, and a randomly sized ECH GREASE payload moves some
    /// browsers' hellos across that bound). Then [`TlsProfile::extensions`] and the expected
    /// strings leave padding out, and captures are compared without it.
    pub padding_varies: bool,
}

/// HTTP/2 behaviour of a profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Http2Profile {
    /// The first SETTINGS frame: (identifier, value) in wire order.
    pub settings: &'static [(u16, u32)],
    /// The connection receive window after the start; the WINDOW_UPDATE increment is this
    /// minus the RFC's 65,535.
    pub connection_window: u32,
    /// PRIORITY frames sent before the first request: (stream, exclusive, depends on, weight
    /// 1–256).
    pub priority_frames: &'static [(u32, bool, u32, u16)],
    /// Pseudo-header order of a request, as initials: `m` method, `a` authority, `s` scheme,
    /// `p` path.
    pub pseudo_order: [char; 4],
    /// The priority carried in each request's HEADERS frame: (exclusive, depends on, weight
    /// 1–256); `None` sends none.
    pub headers_priority: Option<(bool, u32, u16)>,
}

impl Http2Profile {
    /// The value of one SETTINGS identifier, when the profile sends it.
    pub fn setting(&self, id: u16) -> Option<u32> {
        self.settings
            .iter()
            .find(|(i, _)| *i == id)
            .map(|(_, v)| *v)
    }

    /// The connection-level WINDOW_UPDATE increment sent after the SETTINGS frame.
    pub fn window_update(&self) -> u32 {
        self.connection_window.saturating_sub(65_535)
    }
}

/// The fingerprint strings a capture of a profile must give.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expected {
    /// JA4 (with SNI and ALPN `h2`, as a fingerprinted connection to a name sends).
    pub ja4: &'static str,
    /// JA4_r.
    pub ja4_r: &'static str,
    /// JA3N (MD5 of the JA3 string with the extensions sorted).
    pub ja3n: &'static str,
    /// The Akamai HTTP/2 string.
    pub akamai: &'static str,
}

include!(concat!(env!("OUT_DIR"), "/profiles.rs"));

/// The built-in profile named exactly `name`.
pub fn by_name(name: &str) -> Option<&'static Profile> {
    PROFILES.iter().find(|p| p.name == name)
}

/// The built-in profile that `name` names exactly: its own name, one of its aliases
/// (curl_cffi's target names), or a moving alias (a family's name, for its newest profile).
/// Case-sensitive, as every profile name.
pub fn resolve(name: &str) -> Option<&'static Profile> {
    by_name(name)
        .or_else(|| PROFILES.iter().find(|p| p.aliases.contains(&name)))
        .or_else(|| {
            MOVING_ALIASES
                .iter()
                .find(|(alias, _)| *alias == name)
                .and_then(|(_, target)| by_name(target))
        })
}

impl Profile {
    /// Every other name of this profile: its aliases, then the moving alias it holds (if it
    /// is the newest of its family).
    pub fn all_aliases(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.aliases.iter().copied().chain(
            MOVING_ALIASES
                .iter()
                .filter(move |(_, target)| *target == self.name)
                .map(|(alias, _)| *alias),
        )
    }
}

impl Profile {
    /// The ClientHello fields this profile sends (GREASE left out), for comparing with a
    /// capture and for computing its strings from the data alone.
    pub fn client_hello(&self) -> ClientHello {
        ClientHello {
            legacy_version: TLS12,
            ciphers: self.tls.ciphers.to_vec(),
            extensions: self.tls.extensions.to_vec(),
            supported_versions: self.tls.versions.to_vec(),
            signature_algorithms: self.tls.signature_algorithms.to_vec(),
            groups: self.tls.groups.to_vec(),
            point_formats: vec![0],
            alpn: self
                .tls
                .alpn
                .iter()
                .map(|p| p.as_bytes().to_vec())
                .collect(),
            key_shares: self.tls.key_shares.to_vec(),
            cert_compression: self.tls.cert_compression.to_vec(),
            delegated_credentials: self.tls.delegated_credentials.to_vec(),
            record_size_limit: self.tls.record_size_limit,
        }
    }

    /// Orders header names as the browser does: indexes into `names`, the profile's known
    /// names first in its order (duplicates kept together, in the caller's order), the rest
    /// after them in the caller's order. Names are compared ASCII case-insensitively.
    pub fn order_headers<'a>(&self, names: impl Iterator<Item = &'a str>) -> Vec<usize> {
        let rank = |n: &str| {
            self.header_order
                .iter()
                .position(|k| k.eq_ignore_ascii_case(n))
                .unwrap_or(self.header_order.len())
        };
        let mut idx: Vec<(usize, usize)> = names.enumerate().map(|(i, n)| (rank(n), i)).collect();
        // Stable: equal ranks (the same name, or names the profile does not know) keep the
        // caller's order.
        idx.sort_by_key(|(r, _)| *r);
        idx.into_iter().map(|(_, i)| i).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::super::client_hello::{build_record, parse_records};
    use super::super::http2::Http2Start;
    use super::super::tls::fingerprint;
    use super::*;

    /// The data of each profile gives its expected TLS strings (the capture of a real
    /// connection is compared with them by the self-test).
    #[test]
    fn data_gives_the_expected_tls_strings() {
        for p in PROFILES {
            let hello = parse_records(&build_record(&p.client_hello(), Some("example.com")))
                .unwrap_or_else(|e| panic!("{}: {e}", p.name));
            let f = fingerprint(&hello);
            assert_eq!(f.ja4, p.expected.ja4, "{}", p.name);
            assert_eq!(f.ja4_r, p.expected.ja4_r, "{}", p.name);
            assert_eq!(f.ja3n, p.expected.ja3n, "{}: {}", p.name, f.ja3n_string);
        }
    }

    #[test]
    fn data_gives_the_expected_akamai_string() {
        for p in PROFILES {
            let start = Http2Start {
                settings: p.http2.settings.to_vec(),
                window_update: Some(p.http2.window_update()),
                priorities: p.http2.priority_frames.to_vec(),
                pseudo_headers: p
                    .http2
                    .pseudo_order
                    .iter()
                    .map(|c| match c {
                        'm' => "method",
                        'a' => "authority",
                        's' => "scheme",
                        _ => "path",
                    })
                    .map(String::from)
                    .collect(),
                headers_priority: p.http2.headers_priority,
            };
            assert_eq!(start.akamai(), p.expected.akamai, "{}", p.name);
        }
    }

    #[test]
    fn names_are_unique_and_listed() {
        for (i, p) in PROFILES.iter().enumerate() {
            assert_eq!(by_name(p.name).map(|q| q.name), Some(p.name));
            assert!(PROFILES.iter().skip(i + 1).all(|q| q.name != p.name));
            assert!(super::super::is_builtin(p.name), "{}", p.name);
        }
        assert_eq!(super::super::BUILTIN_PROFILES.len(), PROFILES.len());
        assert!(by_name("Chrome_131").is_none());
        // Aliases resolve to their profile; names stay case-sensitive.
        assert_eq!(resolve("chrome131").map(|p| p.name), Some("chrome_131"));
        assert_eq!(resolve("firefox133").map(|p| p.name), Some("firefox_133"));
        assert!(resolve("Chrome131").is_none());
        assert!(resolve("chrome_131 ").is_none());
        // A worker advertises at most this many profiles (the bus protocol's limit).
        assert!(PROFILES.len() <= crate::worker::MAX_WORKER_PROFILES);
    }

    #[test]
    fn each_family_has_its_newest_profile_as_moving_alias() {
        for (alias, target) in MOVING_ALIASES {
            let p = resolve(alias).expect("a moving alias resolves");
            assert_eq!(p.name, *target);
            assert_eq!(p.family, *alias);
            let newest = PROFILES
                .iter()
                .filter(|q| q.family == p.family && q.unsupported.is_none())
                .all(|q| version(q.version) <= version(p.version));
            assert!(newest, "{alias} -> {target}");
            assert!(p.all_aliases().any(|a| a == *alias));
        }
        for p in PROFILES {
            assert!(
                MOVING_ALIASES.iter().any(|(a, _)| *a == p.family),
                "{}",
                p.name
            );
            if p.unsupported.is_some() {
                assert!(
                    MOVING_ALIASES.iter().all(|(_, t)| *t != p.name),
                    "{}",
                    p.name
                );
            }
        }
    }

    fn version(v: &str) -> Vec<u32> {
        v.split('.').map(|x| x.parse().unwrap_or(0)).collect()
    }

    #[test]
    fn key_shares_are_offered_groups() {
        for p in PROFILES {
            assert!(
                p.tls.key_shares.iter().all(|k| p.tls.groups.contains(k)),
                "{}",
                p.name
            );
        }
    }

    #[test]
    fn header_order_puts_known_names_first_and_keeps_the_rest() {
        let names = ["x-b", "Accept", "user-agent", "x-a", "accept"];
        let order = CHROME_131.order_headers(names.iter().copied());
        let got: Vec<&str> = order.iter().map(|&i| names[i]).collect();
        assert_eq!(got, ["user-agent", "Accept", "accept", "x-b", "x-a"]);
        let order = FIREFOX_133.order_headers(names.iter().copied());
        let got: Vec<&str> = order.iter().map(|&i| names[i]).collect();
        assert_eq!(got, ["user-agent", "Accept", "accept", "x-b", "x-a"]);
        assert!(CHROME_131.order_headers(std::iter::empty()).is_empty());
    }
}
