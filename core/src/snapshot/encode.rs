//! Canonical JSON of a validated snapshot, as the admin API returns it and as config history
//! stores it: fixed key order, every rule field explicit, normalised values (uppercase country,
//! lowercase hosts, canonical CIDRs and proxy URLs), rules in evaluation order.

use super::{Constraints, Pool, Rule, ValidatedSnapshot};
use crate::destination::Cidr;
use crate::json::write_str;

pub(super) fn encode(s: &ValidatedSnapshot) -> Vec<u8> {
    let mut out = Vec::with_capacity(256 + 192 * s.rules.len() + 96 * s.pools.len());
    out.extend_from_slice(b"{\"default_timeout_ms\":");
    out.extend_from_slice(s.default_timeout_ms.to_string().as_bytes());
    out.extend_from_slice(b",\"routing\":{\"rules\":[");
    for (i, rule) in s.rules.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        encode_rule(&mut out, rule, &s.pools);
    }
    out.extend_from_slice(b"]},\"pools\":[");
    for (i, pool) in s.pools.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        encode_pool(&mut out, pool);
    }
    out.extend_from_slice(b"],\"destinations\":{\"allow\":");
    encode_cidrs(&mut out, &s.destinations.allow);
    out.extend_from_slice(b",\"deny\":");
    encode_cidrs(&mut out, &s.destinations.deny);
    out.extend_from_slice(b"}}");
    out
}

fn encode_rule(out: &mut Vec<u8>, rule: &Rule, pools: &[Pool]) {
    out.extend_from_slice(b"{\"id\":");
    write_str(out, rule.id.as_str());
    out.extend_from_slice(b",\"priority\":");
    out.extend_from_slice(rule.priority.to_string().as_bytes());
    out.extend_from_slice(b",\"constraints\":");
    encode_constraints(out, &rule.constraints);
    out.extend_from_slice(b",\"pools\":[");
    let mut first = true;
    // Rule pool indices were resolved against this pool list during validation.
    for pool in rule.pools.iter().filter_map(|&i| pools.get(i)) {
        if !first {
            out.push(b',');
        }
        first = false;
        write_str(out, pool.id.as_str());
    }
    out.extend_from_slice(b"],\"sticky_session_ttl_seconds\":");
    out.extend_from_slice(rule.sticky_session_ttl_seconds.to_string().as_bytes());
    out.extend_from_slice(b",\"allow_sticky_fallback\":");
    out.extend_from_slice(if rule.allows_sticky_fallback {
        b"true"
    } else {
        b"false"
    });
    out.push(b'}');
}

fn encode_constraints(out: &mut Vec<u8>, c: &Constraints) {
    out.push(b'{');
    let mut first = true;
    let mut field = |out: &mut Vec<u8>, name: &str, value: &str| {
        if !first {
            out.push(b',');
        }
        first = false;
        write_str(out, name);
        out.push(b':');
        write_str(out, value);
    };
    if let Some(country) = c.country {
        field(out, "country", country.as_str());
    }
    if let Some(region) = &c.region {
        field(out, "region", region);
    }
    if let Some(ip_type) = &c.ip_type {
        field(out, "ip_type", ip_type);
    }
    if let Some(ingress) = c.ingress {
        field(out, "ingress", ingress.as_str());
    }
    if let Some(host) = &c.host {
        field(out, "host", &host.to_string());
    }
    out.push(b'}');
}

fn encode_pool(out: &mut Vec<u8>, pool: &Pool) {
    out.extend_from_slice(b"{\"id\":");
    write_str(out, pool.id.as_str());
    if let Some(u) = &pool.upstream_proxy {
        out.extend_from_slice(b",\"upstream_proxy\":{\"id\":");
        write_str(out, u.id.as_str());
        // One endpoint is written as `url`, so that a snapshot of the original shape (decision
        // 006) encodes as it always did; several as `urls`.
        match u.endpoints.as_slice() {
            [one] => {
                out.extend_from_slice(b",\"url\":");
                write_str(out, &one.to_url());
            }
            many => {
                out.extend_from_slice(b",\"urls\":[");
                for (i, e) in many.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    write_str(out, &e.to_url());
                }
                out.push(b']');
            }
        }
        if let Some(t) = &u.username_template {
            out.extend_from_slice(b",\"username_template\":");
            write_str(out, t.as_str());
        }
        if let Some(p) = &u.password {
            // The admin API returns the complete snapshot so that history and rollback can
            // reapply it; the password is part of it.
            out.extend_from_slice(b",\"password\":");
            write_str(out, p.expose());
        }
        if let Some(name) = &u.password_env {
            out.extend_from_slice(b",\"password_env\":");
            write_str(out, name);
        }
        if let Some(r) = u.resolve {
            out.extend_from_slice(b",\"resolve\":");
            write_str(out, r.as_str());
        }
        out.push(b'}');
    }
    out.push(b'}');
}

fn encode_cidrs(out: &mut Vec<u8>, cidrs: &[Cidr]) {
    out.push(b'[');
    for (i, c) in cidrs.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_str(out, &c.to_string());
    }
    out.push(b']');
}
