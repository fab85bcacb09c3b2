//! Kubernetes resource quantities (`64`, `63500m`, `512Gi`, `1e9`, `1.5G`).
//!
//! Parsed exactly in integer arithmetic (thousandths of a unit), because memory in bytes
//! and CPU in millicores must round the same way every time; floats would not.

/// Why a quantity did not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error(
        "`{0}` is not a quantity (expected a number with an optional suffix such as m, Ki, Mi, Gi, k, M, G or e3)"
    )]
    Malformed(String),
    #[error("`{0}` is negative")]
    Negative(String),
    #[error("`{0}` is too large")]
    TooLarge(String),
}

/// A non-negative quantity in thousandths of its unit (millicores for CPU, millibytes for
/// memory), rounded down.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Quantity {
    milli: u128,
}

impl Quantity {
    /// Whole units, rounded down (CPUs from `63500m` are 63).
    pub fn whole(self) -> u128 {
        self.milli / 1000
    }

    /// Whole mebibytes, rounded down.
    pub fn mebibytes(self) -> u128 {
        self.milli / 1000 / (1 << 20)
    }
}

pub fn parse(input: &str) -> Result<Quantity, QuantityError> {
    let malformed = || QuantityError::Malformed(input.to_owned());
    let s = input.trim();
    let s = match s.strip_prefix('-') {
        Some(rest) if rest.chars().any(|c| c.is_ascii_digit() && c != '0') => {
            return Err(QuantityError::Negative(input.to_owned()));
        }
        Some(rest) => rest,
        None => s.strip_prefix('+').unwrap_or(s),
    };
    let number_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(number_end);
    let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
    if int_part.is_empty() && frac_part.is_empty() {
        return Err(malformed());
    }
    // Decimal exponent and binary multiplier of the suffix.
    let (exp10, binary): (i32, u32) = match suffix {
        "" => (0, 0),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        _ => {
            let exp = suffix
                .strip_prefix(['e', 'E'])
                .and_then(|e| e.parse::<i32>().ok())
                .filter(|e| (-30..=30).contains(e))
                .ok_or_else(malformed)?;
            (exp, 0)
        }
    };
    let too_large = || QuantityError::TooLarge(input.to_owned());
    let digits = format!("{int_part}{frac_part}");
    let mantissa: u128 = digits.parse().map_err(|_| too_large())?;
    // value * 1000 = mantissa * 10^(exp10 + 3 - fraction digits) * 2^binary
    let scale = exp10 + 3 - i32::try_from(frac_part.len()).map_err(|_| malformed())?;
    let mut milli = mantissa.checked_shl(binary).ok_or_else(too_large)?;
    if binary > 0 && milli >> binary != mantissa {
        return Err(too_large());
    }
    if scale >= 0 {
        let factor = 10u128
            .checked_pow(scale.unsigned_abs())
            .ok_or_else(too_large)?;
        milli = milli.checked_mul(factor).ok_or_else(too_large)?;
    } else {
        milli /= 10u128
            .checked_pow(scale.unsigned_abs())
            .unwrap_or(u128::MAX);
    }
    Ok(Quantity { milli })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_kubelets_report() {
        let cases: [(&str, u128); 16] = [
            ("64", 64_000),
            ("63500m", 63_500),
            ("0.5", 500),
            (".5", 500),
            ("1.5k", 1_500_000),
            ("1Ki", 1_024_000),
            ("515Gi", 515 * (1u128 << 30) * 1000),
            ("527920712Ki", 527_920_712 * 1024 * 1000),
            ("1e3", 1_000_000),
            ("1E-3", 1),
            ("2G", 2_000_000_000_000),
            ("100n", 0),
            ("1500u", 1),
            ("+8", 8000),
            ("-0", 0),
            ("0", 0),
        ];
        for (input, milli) in cases {
            assert_eq!(parse(input).map(|q| q.milli), Ok(milli), "{input}");
        }
        assert_eq!(parse("63500m").unwrap().whole(), 63);
        assert_eq!(parse("527920712Ki").unwrap().mebibytes(), 515_547);
    }

    #[test]
    fn refuses_what_is_not_a_quantity() {
        for bad in [
            "", "m", "Gi", "12x", "1.2.3", "abc", "5 Gi", "1e", "1e99", "0x10",
        ] {
            assert!(
                matches!(
                    parse(bad),
                    Err(QuantityError::Malformed(_) | QuantityError::TooLarge(_))
                ),
                "{bad:?} parsed"
            );
        }
        assert_eq!(parse("-1"), Err(QuantityError::Negative("-1".into())));
        assert!(matches!(
            parse("99999999999999999999999999999999999999999"),
            Err(QuantityError::TooLarge(_))
        ));
        assert!(matches!(
            parse("9999999999999999999999Ei"),
            Err(QuantityError::TooLarge(_))
        ));
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Any text is a quantity or an error naming it; never a panic or an overflow.
        #[test]
        fn any_text_is_a_quantity_or_a_named_error(
            text in "[+-]?[0-9]{0,30}(\\.[0-9]{0,12})?([eE][+-]?[0-9]{0,4})?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei|x)?|\\PC{0,20}"
        ) {
            match parse(&text) {
                Ok(q) => {
                    // Every view of a parsed quantity is computable.
                    let _ = (q.whole(), q.milli, q.mebibytes());
                }
                Err(e) => prop_assert!(e.to_string().contains(text.trim()), "{e} for {text:?}"),
            }
        }

        /// Whole numbers of CPUs parse to themselves.
        #[test]
        fn whole_numbers_parse_to_themselves(n in 0u64..1_000_000_000) {
            prop_assert_eq!(parse(&n.to_string()).map(Quantity::whole), Ok(u128::from(n)));
        }
    }
}
