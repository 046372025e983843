//! In-memory metric aggregation: monotonic counters and explicit-bucket
//! histograms, cumulative since telemetry started, one series per
//! (instrument name, sorted attributes). Recording is a hash-map update
//! under a mutex the exporter only holds to copy the totals out.

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};

use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, Histogram, HistogramDataPoint, Metric, NumberDataPoint, Sum, metric::Data,
    number_data_point::Value,
};

use crate::encode::key_values;
use crate::{AttrValue, KeyValue, Result, TelemetryError};

/// OTel's default explicit bucket boundaries.
pub const DEFAULT_BOUNDARIES: [f64; 15] =
    [0.0, 5.0, 10.0, 25.0, 50.0, 75.0, 100.0, 250.0, 500.0, 750.0, 1000.0, 2500.0, 5000.0, 7500.0, 10000.0];

#[derive(Debug, Default)]
pub(crate) struct MetricsStore {
    instruments: HashMap<&'static str, Instrument>,
    counters: HashMap<SeriesKey, u64>,
    histograms: HashMap<SeriesKey, HistogramSeries>,
}

/// What a caller registered about an instrument.
#[derive(Debug, Default)]
struct Instrument {
    unit: &'static str,
    description: &'static str,
    boundaries: Option<Vec<f64>>,
}

#[derive(Debug)]
struct HistogramSeries {
    boundaries: Vec<f64>,
    /// One more than `boundaries`: the last bucket is everything above.
    bucket_counts: Vec<u64>,
    count: u64,
    sum: f64,
    min: f64,
    max: f64,
}

impl MetricsStore {
    pub fn register_counter(&mut self, name: &'static str, unit: &'static str, description: &'static str) {
        let instrument = self.instruments.entry(name).or_default();
        (instrument.unit, instrument.description) = (unit, description);
    }

    /// Series that already exist keep the boundaries they started with.
    pub fn register_histogram(
        &mut self,
        name: &'static str,
        unit: &'static str,
        description: &'static str,
        boundaries: &[f64],
    ) -> Result<()> {
        let increasing = boundaries.windows(2).all(|pair| pair[0] < pair[1]);
        if !increasing || boundaries.iter().any(|bound| !bound.is_finite()) {
            return Err(TelemetryError::InvalidBoundaries { name: name.to_owned() });
        }
        let instrument = Instrument { unit, description, boundaries: Some(boundaries.to_vec()) };
        self.instruments.insert(name, instrument);
        Ok(())
    }

    pub fn counter_add(&mut self, name: &'static str, value: u64, attributes: &[KeyValue]) {
        let total = self.counters.entry(SeriesKey::new(name, attributes)).or_default();
        *total = total.saturating_add(value);
    }

    /// Non-finite values are ignored: they would poison the sum forever.
    pub fn histogram_record(&mut self, name: &'static str, value: f64, attributes: &[KeyValue]) {
        if !value.is_finite() {
            return;
        }
        let boundaries = self.instruments.get(name).and_then(|instrument| instrument.boundaries.as_deref());
        let series = self.histograms.entry(SeriesKey::new(name, attributes)).or_insert_with(|| {
            let boundaries = boundaries.unwrap_or(&DEFAULT_BOUNDARIES).to_vec();
            let bucket_counts = vec![0; boundaries.len() + 1];
            HistogramSeries {
                boundaries,
                bucket_counts,
                count: 0,
                sum: 0.0,
                min: f64::INFINITY,
                max: f64::NEG_INFINITY,
            }
        });
        // Buckets are upper-inclusive: bucket i holds (bounds[i-1], bounds[i]].
        let bucket = series.boundaries.partition_point(|bound| *bound < value);
        series.bucket_counts[bucket] += 1;
        series.count += 1;
        series.sum += value;
        series.min = series.min.min(value);
        series.max = series.max.max(value);
    }

    pub fn is_empty(&self) -> bool {
        self.counters.is_empty() && self.histograms.is_empty()
    }

    /// Every series as OTLP metrics, cumulative from `start` to `now`.
    pub fn snapshot(&self, start: u64, now: u64) -> Vec<Metric> {
        let cumulative = AggregationTemporality::Cumulative.into();
        let mut sums: BTreeMap<&str, Vec<NumberDataPoint>> = BTreeMap::new();
        for (key, total) in &self.counters {
            sums.entry(key.name).or_default().push(NumberDataPoint {
                attributes: key_values(&key.attributes),
                start_time_unix_nano: start,
                time_unix_nano: now,
                value: Some(Value::AsInt(i64::try_from(*total).unwrap_or(i64::MAX))),
                ..NumberDataPoint::default()
            });
        }
        let mut histograms: BTreeMap<&str, Vec<HistogramDataPoint>> = BTreeMap::new();
        for (key, series) in &self.histograms {
            histograms.entry(key.name).or_default().push(HistogramDataPoint {
                attributes: key_values(&key.attributes),
                start_time_unix_nano: start,
                time_unix_nano: now,
                count: series.count,
                sum: Some(series.sum),
                bucket_counts: series.bucket_counts.clone(),
                explicit_bounds: series.boundaries.clone(),
                min: Some(series.min),
                max: Some(series.max),
                ..HistogramDataPoint::default()
            });
        }
        let sums = sums.into_iter().map(|(name, data_points)| {
            (name, Data::Sum(Sum { data_points, aggregation_temporality: cumulative, is_monotonic: true }))
        });
        let histograms = histograms.into_iter().map(|(name, data_points)| {
            (name, Data::Histogram(Histogram { data_points, aggregation_temporality: cumulative }))
        });
        sums.chain(histograms)
            .map(|(name, data)| {
                let instrument = self.instruments.get(name);
                Metric {
                    name: name.to_owned(),
                    description: instrument.map(|i| i.description).unwrap_or_default().to_owned(),
                    unit: instrument.map(|i| i.unit).unwrap_or_default().to_owned(),
                    data: Some(data),
                    ..Metric::default()
                }
            })
            .collect()
    }
}

/// One series: an instrument and its attributes sorted by key. Floats
/// compare by bits so a NaN attribute still finds its series again.
#[derive(Debug)]
struct SeriesKey {
    name: &'static str,
    attributes: Vec<KeyValue>,
}

impl SeriesKey {
    fn new(name: &'static str, attributes: &[KeyValue]) -> SeriesKey {
        let mut attributes = attributes.to_vec();
        attributes.sort_by(|a, b| a.key.cmp(&b.key));
        SeriesKey { name, attributes }
    }
}

impl PartialEq for SeriesKey {
    fn eq(&self, other: &SeriesKey) -> bool {
        let same = |a: &KeyValue, b: &KeyValue| match (&a.value, &b.value) {
            (AttrValue::F64(x), AttrValue::F64(y)) => a.key == b.key && x.to_bits() == y.to_bits(),
            (x, y) => a.key == b.key && x == y,
        };
        self.name == other.name
            && self.attributes.len() == other.attributes.len()
            && self.attributes.iter().zip(&other.attributes).all(|(a, b)| same(a, b))
    }
}

impl Eq for SeriesKey {}

impl Hash for SeriesKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.name.hash(state);
        for kv in &self.attributes {
            kv.key.hash(state);
            match &kv.value {
                AttrValue::String(text) => (0u8, text).hash(state),
                AttrValue::Bool(flag) => (1u8, flag).hash(state),
                AttrValue::I64(number) => (2u8, number).hash(state),
                AttrValue::F64(number) => (3u8, number.to_bits()).hash(state),
                AttrValue::StringArray(items) => (4u8, items).hash(state),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attribute_order_does_not_split_a_series() {
        let mut store = MetricsStore::default();
        store.counter_add("c", 1, &[KeyValue::str("a", "1"), KeyValue::f64("b", f64::NAN)]);
        store.counter_add("c", 2, &[KeyValue::f64("b", f64::NAN), KeyValue::str("a", "1")]);
        assert_eq!(store.counters.len(), 1);
        assert_eq!(store.counters.values().next(), Some(&3));
    }

    #[test]
    fn histogram_buckets_are_upper_inclusive() {
        let mut store = MetricsStore::default();
        store.register_histogram("h", "s", "", &[1.0, 2.0]).unwrap();
        for value in [0.5, 1.0, 1.5, 2.0, 3.0, f64::NAN] {
            store.histogram_record("h", value, &[]);
        }
        let series = store.histograms.values().next().unwrap();
        assert_eq!(series.bucket_counts, [2, 2, 1]);
        assert_eq!((series.count, series.sum, series.min, series.max), (5, 8.0, 0.5, 3.0));
        assert!(store.register_histogram("bad", "", "", &[2.0, 1.0]).is_err());
        assert!(store.register_histogram("bad", "", "", &[f64::INFINITY]).is_err());
    }
}
