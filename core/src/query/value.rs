//! Column values to JSON.

use base64::Engine as _;
use serde_json::{Number, Value};

/// PostgreSQL type OIDs decoded from the binary wire format; every other type is fetched as text.
pub(crate) mod oid {
    pub const BOOL: u32 = 16;
    pub const BYTEA: u32 = 17;
    pub const CHAR: u32 = 18;
    pub const NAME: u32 = 19;
    pub const INT8: u32 = 20;
    pub const INT2: u32 = 21;
    pub const INT4: u32 = 23;
    pub const TEXT: u32 = 25;
    pub const OID: u32 = 26;
    pub const JSON: u32 = 114;
    pub const FLOAT4: u32 = 700;
    pub const FLOAT8: u32 = 701;
    pub const BPCHAR: u32 = 1042;
    pub const VARCHAR: u32 = 1043;
    pub const DATE: u32 = 1082;
    pub const TIME: u32 = 1083;
    pub const TIMESTAMP: u32 = 1114;
    pub const TIMESTAMPTZ: u32 = 1184;
    pub const NUMERIC: u32 = 1700;
    pub const UUID: u32 = 2950;
    pub const JSONB: u32 = 3802;

    pub const KNOWN: &[u32] = &[
        BOOL,
        BYTEA,
        CHAR,
        NAME,
        INT8,
        INT2,
        INT4,
        TEXT,
        OID,
        JSON,
        FLOAT4,
        FLOAT8,
        BPCHAR,
        VARCHAR,
        DATE,
        TIME,
        TIMESTAMP,
        TIMESTAMPTZ,
        NUMERIC,
        UUID,
        JSONB,
    ];
}

pub(crate) fn bytes_to_json(bytes: &[u8]) -> Value {
    Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
}

pub(crate) fn float_to_json(f: f64) -> Value {
    match Number::from_f64(f) {
        Some(n) => Value::Number(n),
        None if f.is_nan() => Value::String("NaN".into()),
        None if f > 0.0 => Value::String("Infinity".into()),
        None => Value::String("-Infinity".into()),
    }
}

fn text(bytes: &[u8]) -> Value {
    Value::String(String::from_utf8_lossy(bytes).into_owned())
}

fn be<const N: usize>(bytes: &[u8]) -> Result<[u8; N], String> {
    bytes
        .try_into()
        .map_err(|_| format!("expected {N} bytes, got {}", bytes.len()))
}

/// Microseconds between 1970-01-01 and PostgreSQL's epoch 2000-01-01.
const PG_EPOCH_MICROS: i64 = 946_684_800_000_000;

fn timestamp(micros: i64) -> Result<jiff::Timestamp, String> {
    jiff::Timestamp::from_microsecond(micros.saturating_add(PG_EPOCH_MICROS))
        .map_err(|e| e.to_string())
}

/// Decode one PostgreSQL value in binary format (only for the OIDs in [`oid::KNOWN`]; anything
/// else is cast to text before it is fetched and arrives as `TEXT`).
pub(crate) fn pg_binary_to_json(type_oid: u32, bytes: &[u8]) -> Result<Value, String> {
    Ok(match type_oid {
        oid::BOOL => Value::Bool(bytes.first().is_some_and(|b| *b != 0)),
        oid::INT2 => Value::from(i16::from_be_bytes(be(bytes)?)),
        oid::INT4 => Value::from(i32::from_be_bytes(be(bytes)?)),
        oid::INT8 => Value::from(i64::from_be_bytes(be(bytes)?)),
        oid::OID => Value::from(u32::from_be_bytes(be(bytes)?)),
        oid::FLOAT4 => float_to_json(f32::from_be_bytes(be(bytes)?) as f64),
        oid::FLOAT8 => float_to_json(f64::from_be_bytes(be(bytes)?)),
        oid::NUMERIC => Value::String(numeric_to_string(bytes)?),
        oid::BYTEA => bytes_to_json(bytes),
        oid::JSON => serde_json::from_slice(bytes).unwrap_or_else(|_| text(bytes)),
        oid::JSONB => match bytes.split_first() {
            Some((1, rest)) => serde_json::from_slice(rest).unwrap_or_else(|_| text(rest)),
            _ => return Err("unknown jsonb format version".into()),
        },
        oid::UUID => {
            let b: [u8; 16] = be(bytes)?;
            let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
            Value::String(format!(
                "{}-{}-{}-{}-{}",
                &h[0..8],
                &h[8..12],
                &h[12..16],
                &h[16..20],
                &h[20..32]
            ))
        }
        oid::TIMESTAMPTZ => match i64::from_be_bytes(be(bytes)?) {
            i64::MAX => Value::String("infinity".into()),
            i64::MIN => Value::String("-infinity".into()),
            us => Value::String(timestamp(us)?.to_string()),
        },
        oid::TIMESTAMP => match i64::from_be_bytes(be(bytes)?) {
            i64::MAX => Value::String("infinity".into()),
            i64::MIN => Value::String("-infinity".into()),
            us => Value::String(
                timestamp(us)?
                    .to_zoned(jiff::tz::TimeZone::UTC)
                    .datetime()
                    .to_string(),
            ),
        },
        oid::DATE => match i32::from_be_bytes(be(bytes)?) {
            i32::MAX => Value::String("infinity".into()),
            i32::MIN => Value::String("-infinity".into()),
            days => {
                let d = jiff::civil::date(2000, 1, 1)
                    .checked_add(jiff::Span::new().days(days as i64))
                    .map_err(|e| e.to_string())?;
                Value::String(d.to_string())
            }
        },
        oid::TIME => {
            let us = i64::from_be_bytes(be(bytes)?);
            let t = jiff::civil::Time::midnight()
                .checked_add(jiff::SignedDuration::from_micros(us))
                .map_err(|e| e.to_string())?;
            Value::String(t.to_string())
        }
        // TEXT, VARCHAR, BPCHAR, NAME, "char" and everything cast to text.
        _ => text(bytes),
    })
}

/// PostgreSQL's binary `numeric`: ndigits, weight, sign, dscale (all 16-bit), then base-10000
/// digits. Rendered exactly, with `dscale` fractional digits, as PostgreSQL prints it.
pub(crate) fn numeric_to_string(bytes: &[u8]) -> Result<String, String> {
    let word = |i: usize| -> Result<u16, String> {
        bytes
            .get(2 * i..2 * i + 2)
            .map(|b| u16::from_be_bytes([b[0], b[1]]))
            .ok_or_else(|| "truncated numeric".to_owned())
    };
    let ndigits = word(0)? as usize;
    let weight = word(1)? as i16 as i64;
    let sign = word(2)?;
    let dscale = word(3)? as usize;
    match sign {
        0xC000 => return Ok("NaN".into()),
        0xD000 => return Ok("Infinity".into()),
        0xF000 => return Ok("-Infinity".into()),
        _ => {}
    }
    let digits = (0..ndigits)
        .map(|i| word(4 + i))
        .collect::<Result<Vec<u16>, String>>()?;
    let digit = |i: i64| -> u16 {
        if i < 0 {
            0
        } else {
            digits.get(i as usize).copied().unwrap_or(0)
        }
    };
    let mut out = String::new();
    if sign == 0x4000 {
        out.push('-');
    }
    if weight < 0 {
        out.push('0');
    } else {
        for i in 0..=weight {
            if i == 0 {
                out.push_str(&digit(i).to_string());
            } else {
                out.push_str(&format!("{:04}", digit(i)));
            }
        }
    }
    if dscale > 0 {
        out.push('.');
        let mut frac = String::new();
        let mut k = 0;
        while frac.len() < dscale {
            frac.push_str(&format!("{:04}", digit(weight + 1 + k)));
            k += 1;
        }
        frac.truncate(dscale);
        out.push_str(&frac);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn numeric(ndigits: u16, weight: i16, sign: u16, dscale: u16, digits: &[u16]) -> Vec<u8> {
        let mut v = Vec::new();
        for w in [ndigits, weight as u16, sign, dscale].iter().chain(digits) {
            v.extend_from_slice(&w.to_be_bytes());
        }
        v
    }

    #[test]
    fn numerics() {
        // 12345.67 = [1, 2345, 6700], weight 1, dscale 2
        assert_eq!(
            numeric_to_string(&numeric(3, 1, 0, 2, &[1, 2345, 6700])).unwrap(),
            "12345.67"
        );
        // -0.0005 = [5], weight -1, dscale 4
        assert_eq!(
            numeric_to_string(&numeric(1, -1, 0x4000, 4, &[5])).unwrap(),
            "-0.0005"
        );
        // 0.00000001 = [1], weight -2, dscale 8
        assert_eq!(
            numeric_to_string(&numeric(1, -2, 0, 8, &[1])).unwrap(),
            "0.00000001"
        );
        // 10000 = [1], weight 1, dscale 0
        assert_eq!(
            numeric_to_string(&numeric(1, 1, 0, 0, &[1])).unwrap(),
            "10000"
        );
        assert_eq!(
            numeric_to_string(&numeric(0, 0, 0, 2, &[])).unwrap(),
            "0.00"
        );
    }

    #[test]
    fn timestamps() {
        let v = pg_binary_to_json(oid::TIMESTAMPTZ, &0i64.to_be_bytes()).unwrap();
        assert_eq!(v, Value::String("2000-01-01T00:00:00Z".into()));
        let v = pg_binary_to_json(oid::DATE, &1i32.to_be_bytes()).unwrap();
        assert_eq!(v, Value::String("2000-01-02".into()));
    }
}
