//! spurctld's compressed hostlists (`JobInfo.nodelist`): names that differ only in their
//! trailing number share one bracket, `node-[1-2]`, `node[001-003,005]`.

use std::collections::BTreeMap;

/// A name split into its prefix and trailing digits (`None` when it ends in no digit).
fn split(name: &str) -> (&str, Option<&str>) {
    let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    if digits == 0 {
        (name, None)
    } else {
        let (prefix, number) = name.split_at(name.len() - digits);
        (prefix, Some(number))
    }
}

/// Compresses `names` as spurctld does: only the trailing digit run is compressed, runs of
/// consecutive numbers of the same width become ranges, a prefix with one host stays bare,
/// and the groups are joined by commas in name order.
pub fn compress(names: &[String]) -> String {
    let mut bare: Vec<&str> = Vec::new();
    let mut numbered: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for name in names {
        match split(name) {
            (_, None) => bare.push(name),
            (prefix, Some(number)) => numbered.entry(prefix).or_default().push(number),
        }
    }
    let mut groups: Vec<String> = bare.into_iter().map(str::to_owned).collect();
    for (prefix, mut numbers) in numbered {
        numbers.sort_by_key(|n| (n.parse::<u64>().unwrap_or(u64::MAX), n.len()));
        numbers.dedup();
        if numbers.len() == 1 {
            groups.push(format!("{prefix}{}", numbers[0]));
            continue;
        }
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
        groups.push(format!("{prefix}[{}]", inner.join(",")));
    }
    groups.sort();
    groups.join(",")
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
            (&[][..], ""),
        ] {
            assert_eq!(compress(&names(input)), expected, "{input:?}");
        }
    }
}
