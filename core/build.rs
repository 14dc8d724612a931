//! Compiles the built-in browser profiles (`profiles/*.toml`, one file per profile, decision 081
//! and 100) into Rust constants: `$OUT_DIR/profiles.rs`, included by `src/fingerprint/profile.rs`.
//!
//! A profile is data: adding a browser release is adding a file. This script reads every file,
//! refuses what cannot be right (unknown keys, a duplicate name or alias, a key share for a group
//! not offered, a pseudo-header order that is not a permutation, a weight outside 1–256, an
//! unknown family), and computes the moving aliases (`chrome`, `safari`, ...: the newest
//! version of each family). The strings a capture must give are checked against the data by the
//! unit tests of `profile.rs`.
// A build script reads its inputs and writes its output: the file rules of `core/clippy.toml`
// are for the library.
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::Deserialize;

/// Families in the order `sortie fingerprints` lists them; each family's name is its moving
/// alias.
const FAMILIES: &[&str] = &[
    "chrome",
    "chrome_android",
    "edge",
    "firefox",
    "tor",
    "safari",
    "safari_ios",
    "okhttp",
];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    name: String,
    browser: String,
    family: String,
    version: String,
    #[serde(default)]
    aliases: Vec<String>,
    source: String,
    unsupported: Option<String>,
    header_order: Vec<String>,
    tls: Tls,
    http2: Http2,
    expected: Expected,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Tls {
    ciphers: Vec<u16>,
    grease: bool,
    groups: Vec<u16>,
    key_shares: Vec<u16>,
    signature_algorithms: Vec<u16>,
    versions: Vec<u16>,
    alpn: Vec<String>,
    extensions: Vec<u16>,
    permute_extensions: bool,
    cert_compression: Vec<u16>,
    delegated_credentials: Vec<u16>,
    record_size_limit: Option<u16>,
    #[serde(default)]
    padding_varies: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Http2 {
    settings: Vec<(u16, u32)>,
    connection_window: u32,
    priority_frames: Vec<PriorityFrame>,
    pseudo_order: String,
    headers_priority: Option<Priority>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PriorityFrame {
    stream: u32,
    exclusive: bool,
    depends_on: u32,
    weight: u16,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Priority {
    exclusive: bool,
    depends_on: u32,
    weight: u16,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Expected {
    ja4: String,
    ja4_r: String,
    ja3n: String,
    akamai: String,
}

fn main() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles");
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut files = Vec::new();
    let entries = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| fail(&format!("reading {}: {e}", dir.display())));
    for entry in entries {
        let path = entry
            .unwrap_or_else(|e| fail(&format!("reading {}: {e}", dir.display())))
            .path();
        if path.extension().and_then(|e| e.to_str()) != Some("toml") {
            continue;
        }
        println!("cargo:rerun-if-changed={}", path.display());
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| fail(&format!("{}: {e}", path.display())));
        let file: File =
            toml::from_str(&text).unwrap_or_else(|e| fail(&format!("{}: {e}", path.display())));
        check(&path, &file);
        files.push(file);
    }
    files.sort_by_key(order_key);
    let moving = moving_aliases(&files);
    check_names(&files, &moving);
    let out = Path::new(&std::env::var("OUT_DIR").unwrap_or_else(|_| fail("OUT_DIR unset")))
        .join("profiles.rs");
    std::fs::write(&out, generate(&files, &moving))
        .unwrap_or_else(|e| fail(&format!("{}: {e}", out.display())));
}

fn fail(why: &str) -> ! {
    eprintln!("built-in profiles: {why}");
    std::process::exit(1)
}

fn version_key(v: &str) -> Vec<u32> {
    v.split('.').map(|p| p.parse().unwrap_or(0)).collect()
}

fn order_key(f: &File) -> (usize, Vec<u32>, String) {
    let family = FAMILIES
        .iter()
        .position(|x| *x == f.family)
        .unwrap_or(FAMILIES.len());
    (family, version_key(&f.version), f.name.clone())
}

fn check(path: &Path, f: &File) {
    let bad = |why: String| fail(&format!("{}: {why}", path.display()));
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    if stem != f.name {
        bad(format!(
            "the file of profile {} must be named {}.toml",
            f.name, f.name
        ));
    }
    let name_ok = |n: &str| {
        !n.is_empty()
            && n.len() <= 64
            && n.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    };
    for n in std::iter::once(&f.name).chain(&f.aliases) {
        if !name_ok(n) {
            bad(format!("{n:?}: names are 1–64 of a-z, 0-9 and _"));
        }
    }
    if !FAMILIES.contains(&f.family.as_str()) {
        bad(format!("family {:?} is not one of {FAMILIES:?}", f.family));
    }
    if f.version.is_empty()
        || !f
            .version
            .split('.')
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
    {
        bad(format!("version {:?} is not dotted numbers", f.version));
    }
    let t = &f.tls;
    if let Some(k) = t.key_shares.iter().find(|k| !t.groups.contains(k)) {
        bad(format!("key share {k:#06x} is not an offered group"));
    }
    if t.padding_varies && t.extensions.contains(&21) {
        bad("a profile whose padding varies lists its extensions without padding (21)".into());
    }
    if t.ciphers.is_empty() || t.versions.is_empty() || t.extensions.is_empty() {
        bad("ciphers, versions and extensions must not be empty".into());
    }
    let mut sorted = f.http2.pseudo_order.chars().collect::<Vec<_>>();
    sorted.sort_unstable();
    if sorted != ['a', 'm', 'p', 's'] {
        bad(format!(
            "pseudo_order {:?} is not an order of m, a, s, p",
            f.http2.pseudo_order
        ));
    }
    let weights = f
        .http2
        .priority_frames
        .iter()
        .map(|p| p.weight)
        .chain(f.http2.headers_priority.as_ref().map(|p| p.weight));
    for w in weights {
        if !(1..=256).contains(&w) {
            bad(format!("weight {w} is outside 1–256"));
        }
    }
    if f.header_order
        .iter()
        .any(|h| h.bytes().any(|b| b.is_ascii_uppercase()))
    {
        bad("header_order names are lowercase".into());
    }
}

/// The newest profile of each family takes the family's name as an alias (of those this build
/// can express: a profile marked `unsupported` never does).
fn moving_aliases(files: &[File]) -> Vec<(String, String)> {
    let mut newest: BTreeMap<&str, &File> = BTreeMap::new();
    for f in files.iter().filter(|f| f.unsupported.is_none()) {
        match newest.get(f.family.as_str()) {
            Some(n) if version_key(&n.version) > version_key(&f.version) => {}
            Some(n) if version_key(&n.version) == version_key(&f.version) => fail(&format!(
                "{} and {} are both the newest {}: give them different versions",
                n.name, f.name, f.family
            )),
            _ => {
                newest.insert(&f.family, f);
            }
        }
    }
    FAMILIES
        .iter()
        .filter_map(|fam| newest.get(fam).map(|f| (fam.to_string(), f.name.clone())))
        .collect()
}

fn check_names(files: &[File], moving: &[(String, String)]) {
    let mut seen = BTreeMap::new();
    let names = files
        .iter()
        .flat_map(|f| {
            std::iter::once(&f.name)
                .chain(&f.aliases)
                .map(move |n| (n, &f.name))
        })
        .chain(moving.iter().map(|(a, n)| (a, n)));
    for (n, owner) in names {
        if let Some(other) = seen.insert(n.clone(), owner.clone()) {
            fail(&format!("the name {n:?} is given by {other} and {owner}"));
        }
    }
}

fn generate(files: &[File], moving: &[(String, String)]) -> String {
    let mut s = String::from("// Generated by core/build.rs from core/profiles/*.toml.\n\n");
    for f in files {
        let t = &f.tls;
        let h = &f.http2;
        let hex = |v: &[u16]| {
            v.iter()
                .map(|x| format!("{x:#06x}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let strs = |v: &[String]| {
            v.iter()
                .map(|x| format!("{x:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let settings = h
            .settings
            .iter()
            .map(|(i, v)| format!("({i}, {v})"))
            .collect::<Vec<_>>()
            .join(", ");
        let frames = h
            .priority_frames
            .iter()
            .map(|p| {
                format!(
                    "({}, {}, {}, {})",
                    p.stream, p.exclusive, p.depends_on, p.weight
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        let pseudo = h
            .pseudo_order
            .chars()
            .map(|c| format!("{c:?}"))
            .collect::<Vec<_>>()
            .join(", ");
        let headers_priority = match &h.headers_priority {
            Some(p) => format!("Some(({}, {}, {}))", p.exclusive, p.depends_on, p.weight),
            None => "None".into(),
        };
        let record = match t.record_size_limit {
            Some(v) => format!("Some({v})"),
            None => "None".into(),
        };
        let _ = writeln!(
            s,
            "/// {browser} (`profiles/{name}.toml`).\n\
             pub const {upper}: Profile = Profile {{\n\
             name: {name:?}, browser: {browser:?}, family: {family:?}, version: {version:?},\n\
             aliases: &[{aliases}], source: {source:?}, unsupported: {unsupported},\n\
             tls: TlsProfile {{ ciphers: &[{ciphers}], grease: {grease}, groups: &[{groups}],\n\
             key_shares: &[{shares}], signature_algorithms: &[{sigalgs}], versions: &[{versions}],\n\
             alpn: &[{alpn}], extensions: &[{exts}], permute_extensions: {permute},\n\
             cert_compression: &[{cc}], delegated_credentials: &[{dc}], record_size_limit: {record},\n\
             padding_varies: {padding_varies} }},\n\
             http2: Http2Profile {{ settings: &[{settings}], connection_window: {window},\n\
             priority_frames: &[{frames}], pseudo_order: [{pseudo}], headers_priority: {headers_priority} }},\n\
             header_order: &[{header_order}],\n\
             expected: Expected {{ ja4: {ja4:?}, ja4_r: {ja4_r:?}, ja3n: {ja3n:?}, akamai: {akamai:?} }},\n\
             }};\n",
            name = f.name,
            upper = f.name.to_ascii_uppercase(),
            browser = f.browser,
            family = f.family,
            version = f.version,
            aliases = strs(&f.aliases),
            source = f.source,
            unsupported = match &f.unsupported {
                Some(why) => format!("Some({why:?})"),
                None => "None".into(),
            },
            ciphers = hex(&t.ciphers),
            grease = t.grease,
            groups = hex(&t.groups),
            shares = hex(&t.key_shares),
            sigalgs = hex(&t.signature_algorithms),
            versions = hex(&t.versions),
            alpn = strs(&t.alpn),
            exts = t
                .extensions
                .iter()
                .map(u16::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            permute = t.permute_extensions,
            cc = hex(&t.cert_compression),
            padding_varies = t.padding_varies,
            dc = hex(&t.delegated_credentials),
            window = h.connection_window,
            header_order = strs(&f.header_order),
            ja4 = f.expected.ja4,
            ja4_r = f.expected.ja4_r,
            ja3n = f.expected.ja3n,
            akamai = f.expected.akamai,
        );
    }
    let consts = files
        .iter()
        .map(|f| f.name.to_ascii_uppercase())
        .collect::<Vec<_>>()
        .join(", ");
    let names = files
        .iter()
        .map(|f| format!("{:?}", f.name))
        .collect::<Vec<_>>()
        .join(", ");
    let moving = moving
        .iter()
        .map(|(a, n)| format!("({a:?}, {n:?})"))
        .collect::<Vec<_>>()
        .join(", ");
    let _ = writeln!(
        s,
        "/// The built-in profiles, in the order `sortie fingerprints` lists them (family, then\n\
         /// version).\npub const PROFILES: &[Profile] = &[{consts}];\n\n\
         /// Their names, in the same order.\npub const NAMES: &[&str] = &[{names}];\n\n\
         /// The moving aliases: each family's name names its newest profile.\n\
         pub const MOVING_ALIASES: &[(&str, &str)] = &[{moving}];"
    );
    s
}
