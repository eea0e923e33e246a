//! Kubernetes quantities as numbers: memory in bytes, CPU in thousandths of a core. [`crate::Limits`]
//! carries them as strings so the CRD and the Pod get exactly what the user wrote; policy ceilings
//! and the local driver compare and apply them as numbers, parsed here (the one parser).

/// Bytes of a memory quantity: a plain number, a decimal suffix (k, M, G, T, P, E) or a binary
/// one (Ki, Mi, Gi, Ti, Pi, Ei), optionally with a decimal fraction ("1.5Gi"). None if invalid.
pub fn memory_bytes(quantity: &str) -> Option<u64> {
    let q = quantity.trim();
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(q.len());
    let (number, suffix) = q.split_at(split);
    let factor: u64 = match suffix {
        "" => 1,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "E" => 1_000_000_000_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        "Ei" => 1 << 60,
        _ => return None,
    };
    scale(number, factor)
}

/// Thousandths of a core of a CPU quantity ("500m", "2", "0.5"). None if invalid.
pub fn cpu_millis(quantity: &str) -> Option<u64> {
    let q = quantity.trim();
    match q.strip_suffix('m') {
        Some(millis) if !millis.contains('.') => millis.parse().ok(),
        Some(_) => None,
        None => scale(q, 1000),
    }
}

/// `number * factor` for a non-negative decimal `number`, rounded up; None on overflow.
fn scale(number: &str, factor: u64) -> Option<u64> {
    if number.is_empty() {
        return None;
    }
    let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && frac.is_empty() {
        return None;
    }
    let whole: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let mut value = whole.checked_mul(factor)?;
    if !frac.is_empty() {
        if frac.len() > 18 || !frac.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let digits: u128 = frac.parse().ok()?;
        let denom = 10u128.pow(frac.len() as u32);
        let part = (digits * u128::from(factor)).div_ceil(denom);
        value = value.checked_add(u64::try_from(part).ok()?)?;
    }
    Some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_suffixes() {
        assert_eq!(memory_bytes("256Mi"), Some(256 << 20));
        assert_eq!(memory_bytes("1Gi"), Some(1 << 30));
        assert_eq!(memory_bytes("1.5Gi"), Some(3 << 29));
        assert_eq!(memory_bytes("128M"), Some(128_000_000));
        assert_eq!(memory_bytes("1000"), Some(1000));
        assert_eq!(memory_bytes("16Ki"), Some(16384));
        assert_eq!(memory_bytes("1G"), Some(1_000_000_000));
        assert_eq!(memory_bytes("1024"), Some(1024));
        for bad in [
            "",
            "Mi",
            "12Q",
            "1Xi",
            "-1Mi",
            "1..2Gi",
            "99999999999999999999Ei",
            "1e3",
        ] {
            assert_eq!(memory_bytes(bad), None, "{bad}");
        }
    }

    #[test]
    fn cpu_forms() {
        assert_eq!(cpu_millis("500m"), Some(500));
        assert_eq!(cpu_millis("2"), Some(2000));
        assert_eq!(cpu_millis("0.25"), Some(250));
        assert_eq!(cpu_millis("1.5m"), None);
        assert_eq!(cpu_millis("x"), None);
    }
}
