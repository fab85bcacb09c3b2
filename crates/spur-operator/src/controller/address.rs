//! Parsing the controller's address as a person writes it.

use std::fmt;
use std::net::Ipv6Addr;
use std::str::FromStr;

use spur_proto::CONTROLLER_PORT;

/// Plain HTTP/2 or HTTP/2 over TLS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    Http,
    Https,
}

/// Where spurctld listens: `host:port`, `http://host:port`, `https://host:port`, or any
/// of these without the port (spurctld's client port, 6817). IPv6 literals go in brackets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControllerAddr {
    pub scheme: Scheme,
    /// A DNS name or an IP literal, without brackets.
    pub host: String,
    pub port: u16,
}

/// What is wrong with an address.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    #[error("the address is empty")]
    Empty,
    #[error("unsupported scheme `{0}://`: use http:// or https://")]
    UnsupportedScheme(String),
    #[error("`{0}` has no host")]
    NoHost(String),
    #[error("`{0}` is not a port number (1 to 65535)")]
    BadPort(String),
    #[error("`{0}` looks like an IPv6 address: put it in brackets, as [{0}]:6817")]
    UnbracketedIpv6(String),
    #[error("`{0}` is not an IPv6 address")]
    BadIpv6(String),
    #[error("`{0}` has a path, query or credentials; give only scheme, host and port")]
    Extra(String),
    #[error("`{0}` is not a valid host name")]
    BadHost(String),
}

impl FromStr for ControllerAddr {
    type Err = AddressError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let input = input.trim();
        if input.is_empty() {
            return Err(AddressError::Empty);
        }
        let (scheme, rest) = match input.split_once("://") {
            Some(("http", rest)) => (Scheme::Http, rest),
            Some(("https", rest)) => (Scheme::Https, rest),
            Some((other, _)) => return Err(AddressError::UnsupportedScheme(other.to_owned())),
            None => (Scheme::Http, input),
        };
        // A single trailing slash is what people paste from a browser; anything more is
        // a path spurctld does not have.
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains(['/', '?', '#', '@']) {
            return Err(AddressError::Extra(input.to_owned()));
        }
        if rest.is_empty() {
            return Err(AddressError::NoHost(input.to_owned()));
        }

        let (host, port) = if let Some(bracketed) = rest.strip_prefix('[') {
            let (ip, after) = bracketed
                .split_once(']')
                .ok_or_else(|| AddressError::BadIpv6(rest.to_owned()))?;
            ip.parse::<Ipv6Addr>()
                .map_err(|_| AddressError::BadIpv6(ip.to_owned()))?;
            let port = match after {
                "" => None,
                _ => Some(
                    after
                        .strip_prefix(':')
                        .ok_or_else(|| AddressError::Extra(input.to_owned()))?,
                ),
            };
            (ip, port)
        } else if rest.matches(':').count() > 1 {
            return Err(AddressError::UnbracketedIpv6(rest.to_owned()));
        } else {
            match rest.split_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (rest, None),
            }
        };

        if host.is_empty() {
            return Err(AddressError::NoHost(input.to_owned()));
        }
        if !host.starts_with('[')
            && !host.contains(':')
            && !host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_')
        {
            return Err(AddressError::BadHost(host.to_owned()));
        }
        let port = match port {
            None => CONTROLLER_PORT,
            Some(p) => match p.parse::<u16>() {
                Ok(port) if port != 0 => port,
                _ => return Err(AddressError::BadPort(p.to_owned())),
            },
        };
        Ok(ControllerAddr {
            scheme,
            host: host.to_owned(),
            port,
        })
    }
}

impl ControllerAddr {
    pub fn new(host: impl Into<String>, port: u16) -> Self {
        ControllerAddr {
            scheme: Scheme::Http,
            host: host.into(),
            port,
        }
    }

    /// `host:port`, with IPv6 literals bracketed.
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// The URI form: `http://host:port` or `https://host:port`.
impl fmt::Display for ControllerAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = match self.scheme {
            Scheme::Http => "http",
            Scheme::Https => "https",
        };
        write!(f, "{scheme}://{}", self.authority())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<ControllerAddr, AddressError> {
        s.parse()
    }

    #[test]
    fn accepts_the_forms_people_write() {
        let cases = [
            ("spurctld:6817", Scheme::Http, "spurctld", 6817),
            ("spurctld", Scheme::Http, "spurctld", 6817),
            (
                "http://spurctld.spur.svc:7000",
                Scheme::Http,
                "spurctld.spur.svc",
                7000,
            ),
            ("http://spurctld/", Scheme::Http, "spurctld", 6817),
            (
                "https://ctl.example.com",
                Scheme::Https,
                "ctl.example.com",
                6817,
            ),
            ("https://10.0.0.5:443", Scheme::Https, "10.0.0.5", 443),
            ("[::1]:6817", Scheme::Http, "::1", 6817),
            ("[fd00::1]", Scheme::Http, "fd00::1", 6817),
            (
                "https://[2001:db8::7]:9000",
                Scheme::Https,
                "2001:db8::7",
                9000,
            ),
            ("  spurctld:6817\n", Scheme::Http, "spurctld", 6817),
        ];
        for (input, scheme, host, port) in cases {
            let addr = parse(input).unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(
                addr,
                ControllerAddr {
                    scheme,
                    host: host.into(),
                    port
                },
                "{input}"
            );
        }
    }

    #[test]
    fn displays_as_a_uri_with_brackets_for_ipv6() {
        assert_eq!(
            parse("spurctld").unwrap().to_string(),
            "http://spurctld:6817"
        );
        assert_eq!(
            parse("https://[::1]:9").unwrap().to_string(),
            "https://[::1]:9"
        );
        assert_eq!(parse("[::1]:9").unwrap().authority(), "[::1]:9");
    }

    #[test]
    fn refuses_bad_input_with_a_reason() {
        let cases = [
            ("", AddressError::Empty),
            (
                "ftp://spurctld",
                AddressError::UnsupportedScheme("ftp".into()),
            ),
            (
                "grpc://spurctld:1",
                AddressError::UnsupportedScheme("grpc".into()),
            ),
            ("http://", AddressError::NoHost("http://".into())),
            (":6817", AddressError::NoHost(":6817".into())),
            ("spurctld:http", AddressError::BadPort("http".into())),
            ("spurctld:0", AddressError::BadPort("0".into())),
            ("spurctld:70000", AddressError::BadPort("70000".into())),
            ("spurctld:", AddressError::BadPort("".into())),
            ("::1:6817", AddressError::UnbracketedIpv6("::1:6817".into())),
            ("[::zz]:1", AddressError::BadIpv6("::zz".into())),
            ("[::1", AddressError::BadIpv6("[::1".into())),
            ("[::1]6817", AddressError::Extra("[::1]6817".into())),
            (
                "http://spurctld:6817/api",
                AddressError::Extra("http://spurctld:6817/api".into()),
            ),
            (
                "http://u:p@spurctld",
                AddressError::Extra("http://u:p@spurctld".into()),
            ),
            ("spur ctld:1", AddressError::BadHost("spur ctld".into())),
        ];
        for (input, expected) in cases {
            assert_eq!(parse(input), Err(expected), "{input:?}");
        }
        // The message says what to do, not only what failed.
        let msg = parse("::1:6817").unwrap_err().to_string();
        assert!(msg.contains("brackets"), "{msg}");
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Any text, address-shaped or not, is an address or an error that says what is
        /// wrong: never a panic, never an empty message.
        #[test]
        fn any_text_is_an_address_or_a_named_error(
            text in "(https?://)?[a-z0-9.:\\[\\]/?@#%-]{0,40}|\\PC{0,40}"
        ) {
            match text.parse::<ControllerAddr>() {
                Ok(addr) => prop_assert!(!addr.authority().is_empty()),
                Err(e) => prop_assert!(!e.to_string().is_empty()),
            }
        }

        /// A well-formed address parses back to itself.
        #[test]
        fn a_host_and_port_round_trip(
            host in "[a-z][a-z0-9-]{0,20}(\\.[a-z][a-z0-9-]{0,10}){0,3}",
            port in 1u16..,
        ) {
            let addr: ControllerAddr = format!("http://{host}:{port}").parse()
                .map_err(|e| TestCaseError::fail(format!("{host}:{port}: {e}")))?;
            prop_assert_eq!(addr.authority(), format!("{host}:{port}"));
        }
    }
}
