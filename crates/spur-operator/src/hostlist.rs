//! Hostlists as spurctld writes them in `JobInfo.nodelist` (fidelity row 15): node names
//! compressed into bracketed ranges, e.g. `node[001-003,005]`, `gpu-node-[1-2]`,
//! `rack[1-2]-n[01-02]`, `login,node[1-2]`.
//!
//! The grammar read here:
//!
//! - a list is terms separated by commas outside brackets; blanks around a term are
//!   ignored, and so are empty terms (`""` is the empty list: a job with no nodes);
//! - a term is literal text and bracket groups, each `[` item (`,` item)* `]`, and stands
//!   for every combination of one item from each group, left to right;
//! - an item is a number (`5`, `005`) or a range `lo-hi` of numbers with `lo <= hi`; each
//!   number is written with at least as many digits as `lo` has (so `001-003` gives
//!   `001 002 003` and `8-10` gives `8 9 10`).
//!
//! Anything else (an unclosed or nested bracket, a stray `]`, an empty item, a letter in a
//! bracket, a reversed range, a number past `u64`) is an error, never a panic, and a list
//! standing for more than [`MAX_HOSTS`] names is refused before it is built.

/// The most names one list may expand to. Far above any allocation (spurctld's own array
/// limit is 100,000 tasks), and it keeps a hostile `n[0-99999999999]` from eating memory.
pub const MAX_HOSTS: usize = 100_000;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HostlistError {
    #[error("`[` at byte {0} is never closed")]
    Unclosed(usize),
    #[error("`]` at byte {0} closes no `[`")]
    StrayClose(usize),
    #[error("`[` at byte {0} inside another bracket")]
    Nested(usize),
    #[error("empty item in the bracket at byte {0}")]
    EmptyItem(usize),
    #[error("`{0}` is not a number or a range of numbers")]
    NotARange(String),
    #[error("range `{0}` runs backwards")]
    Backwards(String),
    #[error("the list stands for more than {MAX_HOSTS} names")]
    TooMany,
}

/// One part of a term: literal text, or the numbers of a bracket group.
enum Segment<'a> {
    Text(&'a str),
    Group(Vec<Item>),
}

/// A bracket item: `lo..=hi`, each written with at least `width` digits.
#[derive(Clone, Copy)]
struct Item {
    lo: u64,
    hi: u64,
    width: usize,
}

impl Item {
    fn count(self) -> u64 {
        // lo <= hi is checked when parsed; saturate anyway, so a count never wraps.
        (self.hi - self.lo).saturating_add(1)
    }
}

/// Every name `list` stands for, in the order written.
pub fn expand(list: &str) -> Result<Vec<String>, HostlistError> {
    let mut names = Vec::new();
    for (offset, term) in split_terms(list)? {
        let trimmed = term.trim();
        if trimmed.is_empty() {
            continue;
        }
        let lead = term.len() - term.trim_start().len();
        let segments = parse_term(trimmed, offset + lead)?;
        expand_term(&segments, &mut names)?;
    }
    Ok(names)
}

/// Splits at commas outside brackets, with each term's byte offset; brackets are checked
/// for balance here, so a term never holds an unclosed one.
fn split_terms(list: &str) -> Result<Vec<(usize, &str)>, HostlistError> {
    let mut terms = Vec::new();
    let mut open: Option<usize> = None;
    let mut start = 0;
    for (i, c) in list.char_indices() {
        match c {
            '[' => match open {
                Some(_) => return Err(HostlistError::Nested(i)),
                None => open = Some(i),
            },
            ']' => match open {
                Some(_) => open = None,
                None => return Err(HostlistError::StrayClose(i)),
            },
            ',' if open.is_none() => {
                terms.push((start, &list[start..i]));
                start = i + 1;
            }
            _ => {}
        }
    }
    if let Some(at) = open {
        return Err(HostlistError::Unclosed(at));
    }
    terms.push((start, &list[start..]));
    Ok(terms)
}

fn parse_term(term: &str, offset: usize) -> Result<Vec<Segment<'_>>, HostlistError> {
    let mut segments = Vec::new();
    let mut rest = term;
    let mut at = offset;
    while let Some(open) = rest.find('[') {
        if open > 0 {
            segments.push(Segment::Text(&rest[..open]));
        }
        // Balanced and unnested: split_terms checked.
        let close = rest[open..]
            .find(']')
            .map(|c| open + c)
            .ok_or(HostlistError::Unclosed(at + open))?;
        let body = &rest[open + 1..close];
        segments.push(Segment::Group(parse_group(body, at + open)?));
        at += close + 1;
        rest = &rest[close + 1..];
    }
    if !rest.is_empty() {
        segments.push(Segment::Text(rest));
    }
    Ok(segments)
}

fn parse_group(body: &str, at: usize) -> Result<Vec<Item>, HostlistError> {
    body.split(',')
        .map(|raw| {
            let item = raw.trim();
            if item.is_empty() {
                return Err(HostlistError::EmptyItem(at));
            }
            let (lo_text, hi_text) = item.split_once('-').unwrap_or((item, item));
            let lo = number(lo_text, item)?;
            let hi = number(hi_text, item)?;
            if lo > hi {
                return Err(HostlistError::Backwards(item.to_owned()));
            }
            Ok(Item {
                lo,
                hi,
                width: lo_text.len(),
            })
        })
        .collect()
}

fn number(digits: &str, item: &str) -> Result<u64, HostlistError> {
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(HostlistError::NotARange(item.to_owned()));
    }
    digits
        .parse()
        .map_err(|_| HostlistError::NotARange(item.to_owned()))
}

fn expand_term(segments: &[Segment<'_>], names: &mut Vec<String>) -> Result<(), HostlistError> {
    // Count first, so an oversized term is refused before anything is built.
    let mut count: u64 = 1;
    for segment in segments {
        if let Segment::Group(items) = segment {
            let in_group = items
                .iter()
                .try_fold(0u64, |sum, item| sum.checked_add(item.count()))
                .ok_or(HostlistError::TooMany)?;
            count = count.checked_mul(in_group).ok_or(HostlistError::TooMany)?;
        }
    }
    let total = (names.len() as u64)
        .checked_add(count)
        .ok_or(HostlistError::TooMany)?;
    if total > MAX_HOSTS as u64 {
        return Err(HostlistError::TooMany);
    }
    let mut partial = vec![String::new()];
    for segment in segments {
        match segment {
            Segment::Text(text) => partial.iter_mut().for_each(|p| p.push_str(text)),
            Segment::Group(items) => {
                let mut next = Vec::with_capacity(partial.len());
                for prefix in &partial {
                    for item in items {
                        for n in item.lo..=item.hi {
                            next.push(format!("{prefix}{n:0width$}", width = item.width));
                        }
                    }
                }
                partial = next;
            }
        }
    }
    names.extend(partial);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn lists_as_spurctld_writes_them() {
        let table: &[(&str, &[&str])] = &[
            ("", &[]),
            ("  ", &[]),
            ("node-1", &["node-1"]),
            (
                "node[001-003,005]",
                &["node001", "node002", "node003", "node005"],
            ),
            ("gpu-node-[1-2]", &["gpu-node-1", "gpu-node-2"]),
            ("node[9,010-011]", &["node9", "node010", "node011"]),
            ("node[8-10]", &["node8", "node9", "node10"]),
            (
                "crsuse2-m2m-[028,219]",
                &["crsuse2-m2m-028", "crsuse2-m2m-219"],
            ),
            ("a,b", &["a", "b"]),
            ("login, node[1-2] ,c", &["login", "node1", "node2", "c"]),
            ("a,,b,", &["a", "b"]),
            (
                "rack[1-2]-n[01-02]",
                &["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"],
            ),
            ("n[1]x", &["n1x"]),
            ("[3-4]", &["3", "4"]),
            ("gpu[01-02],cpu[1]", &["gpu01", "gpu02", "cpu1"]),
            ("n[ 1 , 2 ]", &["n1", "n2"]),
        ];
        for (list, expected) in table {
            let expected: Vec<String> = expected.iter().map(|n| n.to_string()).collect();
            assert_eq!(expand(list), Ok(expected), "{list:?}");
        }
    }

    #[test]
    fn bad_lists_are_errors() {
        let table: &[(&str, HostlistError)] = &[
            ("node[1-2", HostlistError::Unclosed(4)),
            ("node1-2]", HostlistError::StrayClose(7)),
            ("n[1[2]]", HostlistError::Nested(3)),
            ("n[]", HostlistError::EmptyItem(1)),
            ("n[1,]", HostlistError::EmptyItem(1)),
            ("n[a-b]", HostlistError::NotARange("a-b".into())),
            ("n[1-]", HostlistError::NotARange("1-".into())),
            ("n[-1]", HostlistError::NotARange("-1".into())),
            ("n[1-2-3]", HostlistError::NotARange("1-2-3".into())),
            ("n[+1]", HostlistError::NotARange("+1".into())),
            ("n[5-3]", HostlistError::Backwards("5-3".into())),
            (
                "n[99999999999999999999]",
                HostlistError::NotARange("99999999999999999999".into()),
            ),
            ("n[0-99999999999]", HostlistError::TooMany),
            ("n[0-18446744073709551615]", HostlistError::TooMany),
            ("a[0-999]b[0-999]", HostlistError::TooMany),
            ("x]y[", HostlistError::StrayClose(1)),
        ];
        for (list, expected) in table {
            assert_eq!(expand(list).as_ref(), Err(expected), "{list:?}");
        }
    }

    #[test]
    fn the_limit_counts_the_whole_list() {
        assert_eq!(expand("n[1-100000]").map(|v| v.len()), Ok(MAX_HOSTS));
        assert_eq!(expand("n[1-100000],m1"), Err(HostlistError::TooMany));
    }

    /// A prefix and its ranges `(lo, hi, width)`, being built.
    type Group<'a> = Option<(&'a str, Vec<(u64, u64, usize)>)>;

    /// A compressor for the round trip: consecutive names with one prefix become one
    /// bracket; consecutive numbers written alike become one range.
    fn compress(names: &[String]) -> String {
        fn split(name: &str) -> Option<(&str, &str)> {
            let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
            (digits > 0 && digits < name.len() && digits <= 18)
                .then(|| name.split_at(name.len() - digits))
        }
        let mut terms: Vec<String> = Vec::new();
        let mut group: Group<'_> = None;
        let flush = |group: &mut Group<'_>, terms: &mut Vec<String>| {
            if let Some((prefix, items)) = group.take() {
                let body: Vec<String> = items
                    .iter()
                    .map(|&(lo, hi, w)| {
                        if lo == hi {
                            format!("{lo:0w$}")
                        } else {
                            format!("{lo:0w$}-{hi:0w$}")
                        }
                    })
                    .collect();
                terms.push(format!("{prefix}[{}]", body.join(",")));
            }
        };
        for name in names {
            let Some((prefix, digits)) = split(name) else {
                flush(&mut group, &mut terms);
                terms.push(name.clone());
                continue;
            };
            let n: u64 = digits.parse().expect("digits");
            if group.as_ref().is_some_and(|(p, _)| *p != prefix) {
                flush(&mut group, &mut terms);
            }
            let (_, items) = group.get_or_insert((prefix, Vec::new()));
            match items.last_mut() {
                Some((_, hi, w)) if *hi + 1 == n && format!("{n:0w$}", w = *w) == digits => {
                    *hi = n;
                }
                _ => items.push((n, n, digits.len())),
            }
        }
        flush(&mut group, &mut terms);
        terms.join(",")
    }

    fn name() -> impl Strategy<Value = String> {
        (
            prop::sample::select(vec!["node", "gpu-node-", "rack1-n", "login", "a-b-c", ""]),
            prop::option::of((0u64..300, 1usize..5)),
        )
            .prop_filter_map("a name", |(prefix, number)| {
                let name = match number {
                    Some((n, w)) => format!("{prefix}{n:0w$}"),
                    None => prefix.to_owned(),
                };
                (!name.is_empty()).then_some(name)
            })
    }

    proptest! {
        #[test]
        fn compressed_lists_expand_to_what_was_compressed(names in prop::collection::vec(name(), 0..40)) {
            let list = compress(&names);
            prop_assert_eq!(expand(&list), Ok(names), "{}", list);
        }

        #[test]
        fn any_text_is_an_answer_never_a_panic(text in "[a-z0-9\\[\\],\\- ]{0,40}") {
            let _ = expand(&text);
        }
    }
}
