//! spurctld's compressed hostlists (`JobInfo.nodelist`): names that differ only in their
//! trailing number share one bracket, `node-[1-2]`, `node[001-003,005]`.

use std::cmp::Ordering;
use std::collections::BTreeMap;

/// A name split into its prefix and trailing digits; `None` when it ends in no digit or
/// is all digits (spurctld keeps such a name bare).
fn split(name: &str) -> Option<(&str, &str)> {
    let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    if digits == 0 || digits == name.len() {
        None
    } else {
        Some(name.split_at(name.len() - digits))
    }
}

/// One comma-separated term of a hostlist: a bare name, or a prefix with its numbers.
struct Term {
    prefix: String,
    bare: bool,
    lowest: u64,
    rendered: String,
}

/// Compresses `names` as spurctld does: only the trailing digit run is compressed, runs of
/// consecutive numbers of the same width become ranges, a prefix with one host stays
/// unbracketed, and the terms are ordered by prefix in natural order (`rack2` before
/// `rack10`), a bare name before the numbered names of the same prefix.
pub fn compress(names: &[String]) -> String {
    let mut bare: Vec<&str> = Vec::new();
    let mut numbered: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for name in names {
        match split(name) {
            None => bare.push(name),
            Some((prefix, number)) => numbered.entry(prefix).or_default().push(number),
        }
    }
    bare.sort_unstable();
    bare.dedup();
    let mut terms: Vec<Term> = bare
        .into_iter()
        .map(|name| Term {
            prefix: name.to_owned(),
            bare: true,
            lowest: 0,
            rendered: name.to_owned(),
        })
        .collect();
    for (prefix, numbers) in numbered {
        terms.push(numbered_term(prefix, numbers));
    }
    terms.sort_by(|a, b| {
        natural_cmp(&a.prefix, &b.prefix)
            .then_with(|| b.bare.cmp(&a.bare))
            .then_with(|| a.lowest.cmp(&b.lowest))
            .then_with(|| a.rendered.cmp(&b.rendered))
    });
    let rendered: Vec<String> = terms.into_iter().map(|t| t.rendered).collect();
    rendered.join(",")
}

/// The term of `prefix` and its numbers: `node5`, or `node[001-003,005]`.
fn numbered_term(prefix: &str, mut numbers: Vec<&str>) -> Term {
    numbers.sort_by_key(|n| (n.parse::<u64>().unwrap_or(u64::MAX), n.len()));
    numbers.dedup();
    let lowest = numbers[0].parse().unwrap_or(u64::MAX);
    let rendered = if numbers.len() == 1 {
        format!("{prefix}{}", numbers[0])
    } else {
        let mut ranges: Vec<(&str, &str)> = Vec::new();
        for number in numbers {
            if let Some((_, last)) = ranges.last_mut()
                && follows(last, number)
            {
                *last = number;
                continue;
            }
            ranges.push((number, number));
        }
        let inner: Vec<String> = ranges
            .into_iter()
            .map(|(a, b)| {
                if a == b {
                    a.to_owned()
                } else {
                    format!("{a}-{b}")
                }
            })
            .collect();
        format!("{prefix}[{}]", inner.join(","))
    };
    Term {
        prefix: prefix.to_owned(),
        bare: false,
        lowest,
        rendered,
    }
}

/// Natural order: digit runs compare by value (the less padded first when equal), the
/// rest byte by byte.
fn natural_cmp(a: &str, b: &str) -> Ordering {
    let (mut a, mut b) = (a.as_bytes(), b.as_bytes());
    while let (Some(&x), Some(&y)) = (a.first(), b.first()) {
        let order = if x.is_ascii_digit() && y.is_ascii_digit() {
            let (run_a, rest_a) = digit_run(a);
            let (run_b, rest_b) = digit_run(b);
            (a, b) = (rest_a, rest_b);
            let (value_a, value_b) = (trim_zeros(run_a), trim_zeros(run_b));
            value_a
                .len()
                .cmp(&value_b.len())
                .then_with(|| value_a.cmp(value_b))
                .then_with(|| run_a.len().cmp(&run_b.len()))
        } else {
            (a, b) = (&a[1..], &b[1..]);
            x.cmp(&y)
        };
        if order != Ordering::Equal {
            return order;
        }
    }
    a.len().cmp(&b.len())
}

/// The leading digits of `text` and what follows them.
fn digit_run(text: &[u8]) -> (&[u8], &[u8]) {
    let digits = text.iter().take_while(|b| b.is_ascii_digit()).count();
    text.split_at(digits)
}

/// `run` without its leading zeros (keeping one digit).
fn trim_zeros(run: &[u8]) -> &[u8] {
    let zeros = run[..run.len() - 1]
        .iter()
        .take_while(|b| **b == b'0')
        .count();
    &run[zeros..]
}

/// Whether `next` is the number after `last` in the same run: one more, and the same width
/// when either is zero-padded (`009` then `010`, but not `9` then `010`).
fn follows(last: &str, next: &str) -> bool {
    let (Ok(a), Ok(b)) = (last.parse::<u64>(), next.parse::<u64>()) else {
        return false;
    };
    let padded = |n: &str| n.len() > 1 && n.starts_with('0');
    b == a + 1 && (last.len() == next.len() || !(padded(last) || padded(next)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn compresses_as_spurctld_does() {
        for (input, expected) in [
            (&["node-1", "node-2"][..], "node-[1-2]"),
            (&["node001", "node002", "node003"][..], "node[001-003]"),
            (&["node9", "node010", "node011"][..], "node[9,010-011]"),
            (&["node8", "node9", "node10"][..], "node[8-10]"),
            (&["node-1"][..], "node-1"),
            (&["b", "a"][..], "a,b"),
            (
                &["crsuse2-m2m-028", "crsuse2-m2m-219"][..],
                "crsuse2-m2m-[028,219]",
            ),
            (&["rack10-n1", "rack2-n1"][..], "rack2-n1,rack10-n1"),
            (&["a-1", "a-2", "a1", "a2"][..], "a[1-2],a-[1-2]"),
            (&["node1", "node", "node2"][..], "node,node[1-2]"),
            (&["Node-A", "node-1"][..], "Node-A,node-1"),
            (&["123", "node1"][..], "123,node1"),
            (&[][..], ""),
        ] {
            assert_eq!(compress(&names(input)), expected, "{input:?}");
        }
    }
}
