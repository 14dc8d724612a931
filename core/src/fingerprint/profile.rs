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

const CHROME_CIPHERS: &[u16] = &[
    0x1301, 0x1302, 0x1303, 0xc02b, 0xc02f, 0xc02c, 0xc030, 0xcca9, 0xcca8, 0xc013, 0xc014, 0x009c,
    0x009d, 0x002f, 0x0035,
];
const CHROME_SIGALGS: &[u16] = &[
    0x0403, 0x0804, 0x0401, 0x0503, 0x0805, 0x0501, 0x0806, 0x0601,
];
const CHROME_GROUPS: &[u16] = &[0x11ec, 0x001d, 0x0017, 0x0018];
/// Chrome's request header order (navigation requests): the client hints, then the rest.
const CHROME_HEADER_ORDER: &[&str] = &[
    "cache-control",
    "sec-ch-ua",
    "sec-ch-ua-mobile",
    "sec-ch-ua-platform",
    "upgrade-insecure-requests",
    "user-agent",
    "accept",
    "origin",
    "sec-fetch-site",
    "sec-fetch-mode",
    "sec-fetch-user",
    "sec-fetch-dest",
    "referer",
    "accept-encoding",
    "accept-language",
    "cookie",
    "priority",
];
const CHROME_HTTP2: Http2Profile = Http2Profile {
    settings: &[(1, 65_536), (2, 0), (4, 6_291_456), (6, 262_144)],
    connection_window: 15_728_640,
    priority_frames: &[],
    pseudo_order: ['m', 'a', 's', 'p'],
    headers_priority: Some((true, 0, 256)),
};

/// Chrome 131 on desktop.
pub const CHROME_131: Profile = Profile {
    name: "chrome_131",
    browser: "Chrome 131",
    tls: TlsProfile {
        ciphers: CHROME_CIPHERS,
        grease: true,
        groups: CHROME_GROUPS,
        key_shares: &[0x11ec, 0x001d],
        signature_algorithms: CHROME_SIGALGS,
        versions: &[TLS13, TLS12],
        alpn: &["h2", "http/1.1"],
        extensions: &[
            ext::SERVER_NAME,
            ext::EXTENDED_MASTER_SECRET,
            ext::RENEGOTIATION_INFO,
            ext::SUPPORTED_GROUPS,
            ext::EC_POINT_FORMATS,
            ext::SESSION_TICKET,
            ext::ALPN,
            ext::STATUS_REQUEST,
            ext::SIGNATURE_ALGORITHMS,
            ext::SCT,
            ext::KEY_SHARE,
            ext::PSK_KEY_EXCHANGE_MODES,
            ext::SUPPORTED_VERSIONS,
            ext::COMPRESS_CERTIFICATE,
            ext::ALPS_OLD,
            ext::ECH,
        ],
        permute_extensions: true,
        cert_compression: &[cert_compression::BROTLI],
        delegated_credentials: &[],
        record_size_limit: None,
    },
    http2: CHROME_HTTP2,
    header_order: CHROME_HEADER_ORDER,
    expected: Expected {
        ja4: "t13d1516h2_8daaf6152771_02713d6af862",
        ja4_r: "t13d1516h2_002f,0035,009c,009d,1301,1302,1303,c013,c014,c02b,c02c,c02f,c030,cca8,cca9_0005,000a,000b,000d,0012,0017,001b,0023,002b,002d,0033,4469,fe0d,ff01_0403,0804,0401,0503,0805,0501,0806,0601",
        ja3n: "dee19b855b658c6aa0f575eda2525e19",
        akamai: "1:65536;2:0;4:6291456;6:262144|15663105|0|m,a,s,p",
    },
};

/// Firefox 133 on desktop.
pub const FIREFOX_133: Profile = Profile {
    name: "firefox_133",
    browser: "Firefox 133",
    tls: TlsProfile {
        ciphers: &[
            0x1301, 0x1303, 0x1302, 0xc02b, 0xc02f, 0xcca9, 0xcca8, 0xc02c, 0xc030, 0xc00a, 0xc009,
            0xc013, 0xc014, 0x009c, 0x009d, 0x002f, 0x0035,
        ],
        grease: false,
        groups: &[0x11ec, 0x001d, 0x0017, 0x0018, 0x0019, 0x0100, 0x0101],
        key_shares: &[0x11ec, 0x001d, 0x0017],
        signature_algorithms: &[
            0x0403, 0x0503, 0x0603, 0x0804, 0x0805, 0x0806, 0x0401, 0x0501, 0x0601, 0x0203, 0x0201,
        ],
        versions: &[TLS13, TLS12],
        alpn: &["h2", "http/1.1"],
        extensions: &[
            ext::SERVER_NAME,
            ext::EXTENDED_MASTER_SECRET,
            ext::RENEGOTIATION_INFO,
            ext::SUPPORTED_GROUPS,
            ext::EC_POINT_FORMATS,
            ext::SESSION_TICKET,
            ext::ALPN,
            ext::STATUS_REQUEST,
            ext::DELEGATED_CREDENTIALS,
            ext::KEY_SHARE,
            ext::SUPPORTED_VERSIONS,
            ext::SIGNATURE_ALGORITHMS,
            ext::PSK_KEY_EXCHANGE_MODES,
            ext::RECORD_SIZE_LIMIT,
            ext::COMPRESS_CERTIFICATE,
            ext::ECH,
        ],
        permute_extensions: false,
        cert_compression: &[
            cert_compression::ZLIB,
            cert_compression::BROTLI,
            cert_compression::ZSTD,
        ],
        delegated_credentials: &[0x0403, 0x0503, 0x0603, 0x0203],
        record_size_limit: Some(16_385),
    },
    http2: Http2Profile {
        settings: &[(1, 65_536), (2, 0), (4, 131_072), (5, 16_384)],
        connection_window: 12_582_912,
        priority_frames: &[],
        pseudo_order: ['m', 'p', 'a', 's'],
        headers_priority: Some((false, 0, 42)),
    },
    header_order: &[
        "user-agent",
        "accept",
        "accept-language",
        "accept-encoding",
        "referer",
        "origin",
        "cookie",
        "upgrade-insecure-requests",
        "sec-fetch-dest",
        "sec-fetch-mode",
        "sec-fetch-site",
        "sec-fetch-user",
        "priority",
        "te",
    ],
    expected: Expected {
        ja4: "t13d1716h2_5b57614c22b0_eeeea6562960",
        ja4_r: "t13d1716h2_002f,0035,009c,009d,1301,1302,1303,c009,c00a,c013,c014,c02b,c02c,c02f,c030,cca8,cca9_0005,000a,000b,000d,0017,001b,001c,0022,0023,002b,002d,0033,fe0d,ff01_0403,0503,0603,0804,0805,0806,0401,0501,0601,0203,0201",
        ja3n: "90634f51dcf65fc506946108904d6913",
        akamai: "1:65536;2:0;4:131072;5:16384|12517377|0|m,p,a,s",
    },
};

/// The built-in profiles, in the order `sortie fingerprints` lists them.
pub const PROFILES: &[Profile] = &[CHROME_131, FIREFOX_133];

/// The built-in profile named exactly `name`.
pub fn by_name(name: &str) -> Option<&'static Profile> {
    PROFILES.iter().find(|p| p.name == name)
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
