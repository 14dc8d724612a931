//! Routing hints of a request, as validated data, and the ingress mode a request came in on.

/// How a request entered the gateway; an explicit `ingress` rule constraint or a worker's ingress
/// capability tells the modes apart (spec, Routing rule 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Ingress {
    /// POST /api/v1/requests.
    Api,
    /// Absolute-form forward proxy.
    Proxy,
    /// CONNECT tunnel.
    Connect,
}

impl Ingress {
    /// Every mode.
    pub const ALL: [Ingress; 3] = [Ingress::Api, Ingress::Proxy, Ingress::Connect];

    /// The wire name (`api`, `proxy`, `connect`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Ingress::Api => "api",
            Ingress::Proxy => "proxy",
            Ingress::Connect => "connect",
        }
    }

    /// Parses a wire name.
    pub fn from_wire(s: &str) -> Option<Ingress> {
        match s {
            "api" => Some(Ingress::Api),
            "proxy" => Some(Ingress::Proxy),
            "connect" => Some(Ingress::Connect),
            _ => None,
        }
    }
}

/// A two-letter country code, validated and normalised to uppercase ASCII.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CountryCode([u8; 2]);

impl CountryCode {
    /// Parses a code of exactly two ASCII letters, any case, into uppercase. Whether the pair is
    /// an assigned ISO 3166-1 alpha-2 code is checked against the official list.
    pub fn parse(s: &str) -> Option<CountryCode> {
        let &[a, b] = s.as_bytes() else {
            return None;
        };
        if !a.is_ascii_alphabetic() || !b.is_ascii_alphabetic() {
            return None;
        }
        let code = [a.to_ascii_uppercase(), b.to_ascii_uppercase()];
        if !is_assigned_iso3166(code) {
            return None;
        }
        Some(CountryCode(code))
    }

    /// The uppercase code.
    pub fn as_str(&self) -> &str {
        // The bytes are ASCII letters by construction.
        std::str::from_utf8(&self.0).unwrap_or("??")
    }
}

impl std::fmt::Display for CountryCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The officially assigned ISO 3166-1 alpha-2 codes (249 entries).
const ISO3166_ALPHA2: &str = "AD AE AF AG AI AL AM AO AQ AR AS AT AU AW AX AZ BA BB BD BE BF BG BH BI BJ BL BM BN BO BQ BR BS BT BV BW BY BZ CA CC CD CF CG CH CI CK CL CM CN CO CR CU CV CW CX CY CZ DE DJ DK DM DO DZ EC EE EG EH ER ES ET FI FJ FK FM FO FR GA GB GD GE GF GG GH GI GL GM GN GP GQ GR GS GT GU GW GY HK HM HN HR HT HU ID IE IL IM IN IO IQ IR IS IT JE JM JO JP KE KG KH KI KM KN KP KR KW KY KZ LA LB LC LI LK LR LS LT LU LV LY MA MC MD ME MF MG MH MK ML MM MN MO MP MQ MR MS MT MU MV MW MX MY MZ NA NC NE NF NG NI NL NO NP NR NU NZ OM PA PE PF PG PH PK PL PM PN PR PS PT PW PY QA RE RO RS RU RW SA SB SC SD SE SG SH SI SJ SK SL SM SN SO SR SS ST SV SX SY SZ TC TD TF TG TH TJ TK TL TM TN TO TR TT TV TW TZ UA UG UM US UY UZ VA VC VE VG VI VN VU WF WS YE YT ZA ZM ZW";

/// [`ISO3166_ALPHA2`] as a bitmap built at compile time: bit `second - 'A'` of word
/// `first - 'A'` is set for each assigned code, so a lookup is one load and a shift instead of a
/// walk through the list (every request with a country hint pays for it).
#[allow(clippy::indexing_slicing)] // written at compile time, within the list and the array
const ASSIGNED_ISO3166: [u32; 26] = {
    let list = ISO3166_ALPHA2.as_bytes();
    let mut map = [0u32; 26];
    let mut i = 0;
    while i + 1 < list.len() {
        map[(list[i] - b'A') as usize] |= 1 << (list[i + 1] - b'A');
        i += 3;
    }
    map
};

/// Whether `code` (two uppercase ASCII letters) is an assigned ISO 3166-1 alpha-2 code.
fn is_assigned_iso3166(code: [u8; 2]) -> bool {
    let [a, b] = code;
    let (Some(a), Some(b)) = (a.checked_sub(b'A'), b.checked_sub(b'A')) else {
        return false;
    };
    b < 26
        && ASSIGNED_ISO3166
            .get(usize::from(a))
            .is_some_and(|row| row & (1 << b) != 0)
}

/// Validated routing hints of one request (spec, Routing object).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RouteHints {
    /// Requested tags: non-empty, unique; the worker must advertise every one.
    pub tags: Vec<String>,
    /// Requested country, uppercase.
    pub country: Option<CountryCode>,
    /// Requested region.
    pub region: Option<String>,
    /// Requested IP type.
    pub ip_type: Option<String>,
    /// Sticky session id (may be empty: then no pin and no provider session).
    pub sticky_session_id: Option<String>,
}

impl RouteHints {
    /// Whether no hint at all was given.
    pub fn is_empty(&self) -> bool {
        self.tags.is_empty()
            && self.country.is_none()
            && self.region.is_none()
            && self.ip_type.is_none()
            && self.sticky_session_id.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn country_codes() {
        assert_eq!(CountryCode::parse("us").unwrap().as_str(), "US");
        assert_eq!(CountryCode::parse("De").unwrap().as_str(), "DE");
        for bad in ["", "U", "USA", "U1", "ZZ", "XX", "é", "  "] {
            assert!(CountryCode::parse(bad).is_none(), "{bad}");
        }
        assert_eq!(ISO3166_ALPHA2.split(' ').count(), 249);
    }

    /// The bitmap holds exactly the listed codes: every pair of letters against the list.
    #[test]
    fn the_bitmap_holds_the_list() {
        let listed: Vec<&str> = ISO3166_ALPHA2.split(' ').collect();
        let mut set = 0;
        for a in b'A'..=b'Z' {
            for b in b'A'..=b'Z' {
                let code = [a, b];
                let is_listed = listed.contains(&std::str::from_utf8(&code).unwrap());
                assert_eq!(
                    is_assigned_iso3166(code),
                    is_listed,
                    "{}",
                    code.escape_ascii()
                );
                set += usize::from(is_listed);
            }
        }
        assert_eq!(set, 249);
        for outside in [[b'@', b'A'], [b'A', b'['], [b'a', b'a'], [0, 0], [255, 255]] {
            assert!(!is_assigned_iso3166(outside));
        }
    }

    #[test]
    fn ingress_names_round_trip() {
        for i in Ingress::ALL {
            assert_eq!(Ingress::from_wire(i.as_str()), Some(i));
        }
        assert_eq!(Ingress::from_wire("API"), None);
    }
}
