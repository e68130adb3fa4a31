//! Byte counts as people write and read them: parsed from `512M` or `2G`, shown exactly
//! (`2G`) where a config or a command echoes a size back, or rounded (`1536 MiB`, `12.5 GiB`)
//! where a report or a log line states an amount. The one place sizes are formatted.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer};

/// A byte count parsed from `4096`, `64K`, `512M`, `2G`, `1T` (binary units; `KiB`/`KB` too).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

#[derive(Debug, thiserror::Error)]
#[error(
    "invalid size {0:?}: write a number of bytes with an optional K, M, G or T suffix, e.g. 512M"
)]
pub struct SizeError(String);

impl FromStr for ByteSize {
    type Err = SizeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || SizeError(s.to_owned());
        let t = s.trim();
        let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, unit) = t.split_at(digits);
        let n: u64 = num.parse().map_err(|_| err())?;
        let shift = match unit.trim().to_ascii_uppercase().as_str() {
            "" | "B" => 0,
            "K" | "KB" | "KIB" => 10,
            "M" | "MB" | "MIB" => 20,
            "G" | "GB" | "GIB" => 30,
            "T" | "TB" | "TIB" => 40,
            _ => return Err(err()),
        };
        n.checked_mul(1 << shift).map(ByteSize).ok_or_else(err)
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(&str, u64); 4] = [
            ("T", 1 << 40),
            ("G", 1 << 30),
            ("M", 1 << 20),
            ("K", 1 << 10),
        ];
        for (name, size) in UNITS {
            if self.0 >= size && self.0.is_multiple_of(size) {
                return write!(f, "{}{name}", self.0 / size);
            }
        }
        write!(f, "{}", self.0)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        number_or_text(d)
    }
}

/// A config value written as a plain number (bytes) or as text (`"2G"`), parsed as text.
pub(crate) fn number_or_text<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: FromStr,
    T::Err: fmt::Display,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        N(u64),
        S(String),
    }
    let text = match Raw::deserialize(d)? {
        Raw::N(n) => n.to_string(),
        Raw::S(s) => s,
    };
    text.parse().map_err(serde::de::Error::custom)
}

const MIB: u64 = 1 << 20;

impl ByteSize {
    /// Rounded for reading: whole MiB below 10 GiB, GiB with one decimal above.
    pub fn rounded(self) -> Rounded {
        Rounded(self.0)
    }
}

/// [`ByteSize::rounded`]'s display.
pub struct Rounded(u64);

impl fmt::Display for Rounded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 >= 10 << 30 {
            write!(f, "{:.1} GiB", self.0 as f64 / (1u64 << 30) as f64)
        } else {
            write!(f, "{} MiB", self.0 / MIB)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!("4096".parse::<ByteSize>().unwrap().0, 4096);
        assert_eq!("64K".parse::<ByteSize>().unwrap().0, 65536);
        assert_eq!("512M".parse::<ByteSize>().unwrap().0, 512 << 20);
        assert_eq!("2G".parse::<ByteSize>().unwrap().0, 2 << 30);
        assert_eq!("2GiB".parse::<ByteSize>().unwrap().0, 2 << 30);
        for bad in ["", "G", "1.5G", "12Q", "-1", "99999999999T"] {
            assert!(bad.parse::<ByteSize>().is_err(), "{bad}");
        }
        assert_eq!(ByteSize(512 << 20).to_string(), "512M");
        assert_eq!(ByteSize(1000).to_string(), "1000");
        assert_eq!(ByteSize(1536 << 20).rounded().to_string(), "1536 MiB");
        assert_eq!(ByteSize((25 << 30) / 2).rounded().to_string(), "12.5 GiB");
        assert_eq!(ByteSize(MIB - 1).rounded().to_string(), "0 MiB");
    }
}
