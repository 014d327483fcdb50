//! The webhook destination guard: which addresses the relay may connect to.
//!
//! Outbox payloads are written by applications, so a webhook URL is untrusted
//! input. By default only public unicast addresses are allowed; loopback,
//! private, link-local, CGNAT, unspecified, multicast, documentation,
//! benchmarking and other special-purpose ranges are refused, including their
//! IPv4-mapped, 6to4 and NAT64 spellings. `allowed_networks` opens exactly
//! the networks it lists.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

/// Why an address is not public, or `None` when it is.
pub fn special_purpose(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => special_v4(v4),
        IpAddr::V6(v6) => special_v6(v6),
    }
}

fn special_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let o = ip.octets();
    let reason = match o {
        [0, ..] => "unspecified (0.0.0.0/8)",
        [10, ..] => "private (10.0.0.0/8)",
        [100, b, ..] if (64..128).contains(&b) => "shared CGNAT (100.64.0.0/10)",
        [127, ..] => "loopback (127.0.0.0/8)",
        [169, 254, ..] => "link-local (169.254.0.0/16)",
        [172, b, ..] if (16..32).contains(&b) => "private (172.16.0.0/12)",
        [192, 0, 0, _] => "IETF protocol assignments (192.0.0.0/24)",
        [192, 0, 2, _] => "documentation (192.0.2.0/24)",
        [192, 88, 99, _] => "6to4 relay anycast (192.88.99.0/24)",
        [192, 168, ..] => "private (192.168.0.0/16)",
        [198, 18 | 19, ..] => "benchmarking (198.18.0.0/15)",
        [198, 51, 100, _] => "documentation (198.51.100.0/24)",
        [203, 0, 113, _] => "documentation (203.0.113.0/24)",
        [a, ..] if (224..240).contains(&a) => "multicast (224.0.0.0/4)",
        [a, ..] if a >= 240 => "reserved or broadcast (240.0.0.0/4)",
        _ => return None,
    };
    Some(reason)
}

fn special_v6(ip: Ipv6Addr) -> Option<&'static str> {
    if ip.is_unspecified() {
        return Some("unspecified (::)");
    }
    if ip.is_loopback() {
        return Some("loopback (::1)");
    }
    let s = ip.segments();
    // IPv4 embedded in IPv6: judge the IPv4 address it reaches.
    if let Some(v4) = ip.to_ipv4_mapped() {
        return special_v4(v4).map(|_| "IPv4-mapped special-purpose address (::ffff:0:0/96)");
    }
    if s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0, 0, 0, 0] {
        let v4 = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
        return special_v4(v4).map(|_| "NAT64 of a special-purpose address (64:ff9b::/96)");
    }
    if s[0] == 0x2002 {
        let v4 = Ipv4Addr::new((s[1] >> 8) as u8, s[1] as u8, (s[2] >> 8) as u8, s[2] as u8);
        return special_v4(v4).map(|_| "6to4 of a special-purpose address (2002::/16)");
    }
    let reason = match s {
        [0, 0, 0, 0, 0, 0, _, _] => "IPv4-compatible (::/96)",
        [0x64, 0xff9b, 1, ..] => "local-use NAT64 (64:ff9b:1::/48)",
        [0x100, 0, 0, 0, ..] => "discard-only (100::/64)",
        [0x2001, 0xdb8, ..] => "documentation (2001:db8::/32)",
        [0x2001, b, ..] if b < 0x200 => "IETF protocol assignments (2001::/23)",
        [0x3fff, b, ..] if b < 0x1000 => "documentation (3fff::/20)",
        [a, ..] if a & 0xfe00 == 0xfc00 => "unique local (fc00::/7)",
        [a, ..] if a & 0xffc0 == 0xfe80 => "link-local (fe80::/10)",
        [a, ..] if a & 0xffc0 == 0xfec0 => "site-local (fec0::/10)",
        [a, ..] if a & 0xff00 == 0xff00 => "multicast (ff00::/8)",
        _ => return None,
    };
    Some(reason)
}

/// The guard's decision for one address: `Ok` to connect, `Err(reason)`.
/// An address inside `allowed` is always allowed; IPv4-mapped IPv6 addresses
/// also match IPv4 networks.
pub fn check(ip: IpAddr, allowed: &[IpNet]) -> Result<(), String> {
    let canonical = ip.to_canonical();
    if allowed
        .iter()
        .any(|n| n.contains(&ip) || n.contains(&canonical))
    {
        return Ok(());
    }
    match special_purpose(ip) {
        None => Ok(()),
        Some(reason) => Err(format!(
            "destination address {ip} is {reason}; add it to webhook.allowed_networks to allow it"
        )),
    }
}

/// Parse `allowed_networks` entries: CIDR networks or single addresses.
pub fn parse_networks(entries: &[String]) -> Result<Vec<IpNet>, String> {
    entries
        .iter()
        .map(|e| {
            e.parse::<IpNet>()
                .or_else(|_| e.parse::<IpAddr>().map(IpNet::from))
                .map_err(|_| format!("{e:?} is not a network (like 127.0.0.0/8) or an address"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(s: &str) -> bool {
        check(s.parse().unwrap(), &[]).is_err()
    }

    #[test]
    fn refuses_every_special_purpose_range() {
        for ip in [
            "0.0.0.0",
            "0.1.2.3",
            "10.1.2.3",
            "100.64.0.1",
            "100.127.255.255",
            "127.0.0.1",
            "127.255.0.9",
            "169.254.169.254",
            "172.16.0.1",
            "172.31.255.255",
            "192.0.0.8",
            "192.0.2.1",
            "192.88.99.1",
            "192.168.1.1",
            "198.18.0.1",
            "198.19.255.1",
            "198.51.100.7",
            "203.0.113.9",
            "224.0.0.1",
            "239.255.255.250",
            "240.0.0.1",
            "255.255.255.255",
            "::",
            "::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "64:ff9b::a00:1",
            "64:ff9b::7f00:1",
            "64:ff9b:1::1",
            "100::1",
            "2001:db8::1",
            "2001::1",
            "2002:7f00:1::1",
            "2002:c0a8:101::1",
            "3fff::1",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "fec0::1",
            "ff02::1",
        ] {
            assert!(refused(ip), "{ip} should be refused");
        }
    }

    #[test]
    fn allows_public_unicast() {
        for ip in [
            "1.1.1.1",
            "8.8.8.8",
            "100.63.255.255",
            "100.128.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "192.0.3.1",
            "198.20.0.1",
            "223.255.255.255",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::1",
        ] {
            assert!(!refused(ip), "{ip} should be allowed");
        }
    }

    #[test]
    fn allowed_networks_open_exactly_what_they_list() {
        let allowed = parse_networks(&["127.0.0.1/32".into(), "::1".into()]).unwrap();
        assert!(check("127.0.0.1".parse().unwrap(), &allowed).is_ok());
        assert!(check("::ffff:127.0.0.1".parse().unwrap(), &allowed).is_ok());
        assert!(check("::1".parse().unwrap(), &allowed).is_ok());
        assert!(check("127.0.0.2".parse().unwrap(), &allowed).is_err());
        assert!(check("10.0.0.1".parse().unwrap(), &allowed).is_err());
        let err = check("127.0.0.2".parse().unwrap(), &allowed).unwrap_err();
        assert!(
            err.contains("loopback") && err.contains("allowed_networks"),
            "{err}"
        );
    }

    #[test]
    fn rejects_malformed_networks() {
        assert!(parse_networks(&["127.0.0.0/33".into()]).is_err());
        assert!(parse_networks(&["localhost".into()]).is_err());
    }
}
