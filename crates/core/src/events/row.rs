//! One row of `memscope_dump_{ts}.csv` / the `memscope_dump` table.

use std::fmt;

use super::attrs::raw_value;

/// The dump's columns, in order: the CSV's header line and the SQLite table's columns.
pub const HEADER: &str = "ID,Event,Event Type,Name,Timestamp(ns),Process Id,Thread Id,Device Id,Ptr,Attr,Call Stack(Python),Call Stack(C)";

/// The `Event` column.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum Event {
    Malloc = 1,
    Free = 2,
    Access = 3,
    OpLaunch = 4,
    KernelLaunch = 5,
    Mstx = 6,
    System = 7,
    Snapshot = 8,
    OomDetail = 9,
}

impl Event {
    pub const ALL: [Event; 9] = [
        Event::Malloc,
        Event::Free,
        Event::Access,
        Event::OpLaunch,
        Event::KernelLaunch,
        Event::Mstx,
        Event::System,
        Event::Snapshot,
        Event::OomDetail,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Event::Malloc => "MALLOC",
            Event::Free => "FREE",
            Event::Access => "ACCESS",
            Event::OpLaunch => "OP_LAUNCH",
            Event::KernelLaunch => "KERNEL_LAUNCH",
            Event::Mstx => "MSTX",
            Event::System => "SYSTEM",
            Event::Snapshot => "SNAPSHOT",
            Event::OomDetail => "OOM_DETAIL",
        }
    }

    pub fn from_u32(v: u32) -> Option<Event> {
        Event::ALL.into_iter().find(|e| *e as u32 == v)
    }

    pub fn parse(s: &str) -> Option<Event> {
        // A match rather than a search of `ALL`: readers call this on every row.
        Some(match s {
            "MALLOC" => Event::Malloc,
            "FREE" => Event::Free,
            "ACCESS" => Event::Access,
            "OP_LAUNCH" => Event::OpLaunch,
            "KERNEL_LAUNCH" => Event::KernelLaunch,
            "MSTX" => Event::Mstx,
            "SYSTEM" => Event::System,
            "SNAPSHOT" => Event::Snapshot,
            "OOM_DETAIL" => Event::OomDetail,
            _ => return None,
        })
    }
}

/// The `Event Type` column.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum EventType {
    Hal = 1,
    Pta = 2,
    Host = 3,
    Read = 4,
    Write = 5,
    Unknown = 6,
    AtenStart = 7,
    AtenEnd = 8,
    KernelLaunch = 9,
    Mark = 10,
    RangeStart = 11,
    RangeEnd = 12,
    StartTrace = 13,
    StopTrace = 14,
    Step = 15,
    Snapshot = 16,
    OomTrigger = 17,
    OomRecentAlloc = 18,
    OomTopAlloc = 19,
    /// A SYSTEM row that gives a live block a new `owner` (decompose learns some owners after
    /// the block's MALLOC row is written: a tensor becomes a parameter, a gradient, a state).
    Owner = 20,
    /// A SYSTEM row that names what holds a live block (Ptr): Name is the chain of references
    /// from a root to the tensor, found by the Python side for the leaks analysis.
    Holder = 21,
}

impl EventType {
    pub const ALL: [EventType; 21] = [
        EventType::Hal,
        EventType::Pta,
        EventType::Host,
        EventType::Read,
        EventType::Write,
        EventType::Unknown,
        EventType::AtenStart,
        EventType::AtenEnd,
        EventType::KernelLaunch,
        EventType::Mark,
        EventType::RangeStart,
        EventType::RangeEnd,
        EventType::StartTrace,
        EventType::StopTrace,
        EventType::Step,
        EventType::Snapshot,
        EventType::OomTrigger,
        EventType::OomRecentAlloc,
        EventType::OomTopAlloc,
        EventType::Owner,
        EventType::Holder,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Hal => "HAL",
            EventType::Pta => "PTA",
            EventType::Host => "HOST",
            EventType::Read => "READ",
            EventType::Write => "WRITE",
            EventType::Unknown => "UNKNOWN",
            EventType::AtenStart => "ATEN_START",
            EventType::AtenEnd => "ATEN_END",
            EventType::KernelLaunch => "KERNEL_LAUNCH",
            EventType::Mark => "Mark",
            EventType::RangeStart => "Range_start",
            EventType::RangeEnd => "Range_end",
            EventType::StartTrace => "START_TRACE",
            EventType::StopTrace => "STOP_TRACE",
            EventType::Step => "STEP",
            EventType::Snapshot => "SNAPSHOT",
            EventType::OomTrigger => "OOM_TRIGGER",
            EventType::OomRecentAlloc => "OOM_RECENT_ALLOC",
            EventType::OomTopAlloc => "OOM_TOP_ALLOC",
            EventType::Owner => "OWNER",
            EventType::Holder => "HOLDER",
        }
    }

    pub fn from_u32(v: u32) -> Option<EventType> {
        EventType::ALL.into_iter().find(|e| *e as u32 == v)
    }

    pub fn parse(s: &str) -> Option<EventType> {
        Some(match s {
            "HAL" => EventType::Hal,
            "PTA" => EventType::Pta,
            "HOST" => EventType::Host,
            "READ" => EventType::Read,
            "WRITE" => EventType::Write,
            "UNKNOWN" => EventType::Unknown,
            "ATEN_START" => EventType::AtenStart,
            "ATEN_END" => EventType::AtenEnd,
            "KERNEL_LAUNCH" => EventType::KernelLaunch,
            "Mark" => EventType::Mark,
            "Range_start" => EventType::RangeStart,
            "Range_end" => EventType::RangeEnd,
            "START_TRACE" => EventType::StartTrace,
            "STOP_TRACE" => EventType::StopTrace,
            "STEP" => EventType::Step,
            "SNAPSHOT" => EventType::Snapshot,
            "OOM_TRIGGER" => EventType::OomTrigger,
            "OOM_RECENT_ALLOC" => EventType::OomRecentAlloc,
            "OOM_TOP_ALLOC" => EventType::OomTopAlloc,
            "OWNER" => EventType::Owner,
            "HOLDER" => EventType::Holder,
            _ => return None,
        })
    }
}

/// The `Device Id` column: `cpu`, a CUDA index, or `N/A` for rows without a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DeviceId {
    None,
    Cpu,
    Cuda(u32),
}

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceId::None => f.write_str("N/A"),
            DeviceId::Cpu => f.write_str("cpu"),
            DeviceId::Cuda(i) => write!(f, "{i}"),
        }
    }
}

impl DeviceId {
    pub fn parse(s: &str) -> Option<DeviceId> {
        match s {
            "N/A" | "" => Some(DeviceId::None),
            "cpu" => Some(DeviceId::Cpu),
            _ => s.parse().ok().map(DeviceId::Cuda),
        }
    }

    /// The output directory name: `device_cpu`, `device_0`, ...
    pub fn dir_name(&self) -> String {
        match self {
            DeviceId::Cuda(i) => format!("device_{i}"),
            _ => "device_cpu".to_string(),
        }
    }
}

/// The `Attr` column: key/value pairs in insertion order, written as one JSON object.
pub type Attrs = serde_json::Map<String, serde_json::Value>;

/// The [`NUMERIC_ATTRS`](super::reader::NUMERIC_ATTRS) values and the string `owner` of a row's
/// `attrs_json`, as the reader found them while checking it, so that an analysis reading `size`
/// or `owner` does not search the text again. They answer only for the very string they were read from (its address and
/// length): a row whose `attrs_json` is replaced reads the text, as a row never read does.
#[derive(Clone, Copy, Debug, Default)]
pub struct AttrNumbers {
    text: Option<(usize, usize)>,
    /// What the quick check found ([`Plain`](super::attrs::Plain)).
    found: super::attrs::Plain,
}

impl AttrNumbers {
    /// The values found in `text`, the string they are to answer for.
    pub(crate) fn of(text: &str, found: super::attrs::Plain) -> AttrNumbers {
        AttrNumbers {
            text: Some((text.as_ptr() as usize, text.len())),
            found,
        }
    }

    fn answers_for(&self, text: &str) -> bool {
        self.text == Some((text.as_ptr() as usize, text.len()))
    }

    /// `Some(value)` when these numbers are `text`'s and `key` is one of them.
    fn get(&self, text: &str, key: &str) -> Option<Option<u64>> {
        if !self.answers_for(text) {
            return None;
        }
        let index = super::attrs::numeric_attr_index(key)?;
        Some((self.found.present >> index & 1 != 0).then(|| self.found.values[index]))
    }

    /// `Some(value)` when these are `text`'s and `key` is one of the string keys they keep: its
    /// string value, if it has one.
    fn string<'a>(&self, text: &'a str, key: &str) -> Option<Option<&'a str>> {
        if !self.answers_for(text) {
            return None;
        }
        let index = super::attrs::string_attr_index_of(key.as_bytes())?;
        Some(
            self.found.strings[index]
                .and_then(|(start, end)| text.get(start as usize..end as usize)),
        )
    }
}

/// A row. `id` is assigned by the writer in time order.
#[derive(Clone, Debug)]
pub struct EventRow {
    pub id: u64,
    pub event: Event,
    pub event_type: EventType,
    pub name: String,
    pub ts_ns: u64,
    pub pid: u32,
    pub tid: u64,
    pub device: DeviceId,
    pub ptr: Option<u64>,
    pub attrs: Attrs,
    /// The Attr column as a producer rendered it (a JSON object); when set it is written as is
    /// and `attrs` is empty, which spares the hot path parsing and re-rendering it.
    pub attrs_json: Option<String>,
    pub python_stack: String,
    pub c_stack: String,
    /// What the reader already knows of `attrs_json`; not part of the row's value.
    pub(crate) numbers: AttrNumbers,
}

impl PartialEq for EventRow {
    fn eq(&self, other: &EventRow) -> bool {
        // Every column; `numbers` is a cache of `attrs_json`.
        self.id == other.id
            && self.event == other.event
            && self.event_type == other.event_type
            && self.name == other.name
            && self.ts_ns == other.ts_ns
            && self.pid == other.pid
            && self.tid == other.tid
            && self.device == other.device
            && self.ptr == other.ptr
            && self.attrs == other.attrs
            && self.attrs_json == other.attrs_json
            && self.python_stack == other.python_stack
            && self.c_stack == other.c_stack
    }
}

impl EventRow {
    /// A bare row: everything but the identity columns empty.
    pub fn new(event: Event, event_type: EventType, name: impl Into<String>) -> EventRow {
        EventRow {
            id: 0,
            event,
            event_type,
            name: name.into(),
            ts_ns: 0,
            pid: 0,
            tid: 0,
            device: DeviceId::None,
            ptr: None,
            attrs: Attrs::new(),
            attrs_json: None,
            python_stack: String::new(),
            c_stack: String::new(),
            numbers: AttrNumbers::default(),
        }
    }

    /// Makes this row a bare one of `event`/`event_type`, as [`EventRow::new`] with an empty
    /// name does, keeping its strings' capacity: a producer of many rows reuses rows instead
    /// of allocating each one's strings. `attrs_json` becomes `None` (take it first to reuse
    /// its string).
    pub fn reset(&mut self, event: Event, event_type: EventType) {
        self.id = 0;
        self.event = event;
        self.event_type = event_type;
        self.name.clear();
        self.ts_ns = 0;
        self.pid = 0;
        self.tid = 0;
        self.device = DeviceId::None;
        self.ptr = None;
        self.attrs.clear();
        self.attrs_json = None;
        self.python_stack.clear();
        self.c_stack.clear();
        // The cache answers by the text's address and length, which a reused string keeps.
        self.numbers = AttrNumbers::default();
    }

    /// The Attr column's text.
    pub fn attrs_text(&self) -> String {
        match &self.attrs_json {
            Some(raw) => raw.clone(),
            None => serde_json::to_string(&self.attrs).unwrap_or_else(|_| "{}".into()),
        }
    }

    /// Parses a pre-rendered Attr into `attrs` (readers that need the values call this).
    pub fn parse_attrs(&mut self) {
        if let Some(raw) = self.attrs_json.take() {
            self.attrs = serde_json::from_str(&raw).unwrap_or_default();
        }
    }

    /// A numeric Attr value, from the parsed map or straight from the raw text (no JSON parse:
    /// analyses read `size` from millions of rows).
    pub fn attr_u64(&self, key: &str) -> Option<u64> {
        if let Some(value) = self.parsed_attr(key) {
            return value.as_u64();
        }
        let text = self.attrs_json.as_deref()?;
        if let Some(known) = self.numbers.get(text, key) {
            return known;
        }
        let raw = raw_value(text, key)?;
        let digits = raw.bytes().take_while(u8::is_ascii_digit).count();
        raw[..digits].parse().ok()
    }

    /// `key` in the parsed map (empty on rows a reader gave, which keep the text instead).
    fn parsed_attr(&self, key: &str) -> Option<&serde_json::Value> {
        if self.attrs.is_empty() {
            return None;
        }
        self.attrs.get(key)
    }

    /// Whether the Attr values were found when `attrs_json` was made or read, so that
    /// [`EventRow::attr_u64`] answers without searching the text.
    pub(crate) fn attrs_known(&self) -> bool {
        self.attrs_json
            .as_deref()
            .is_some_and(|text| self.numbers.answers_for(text))
    }

    /// A string Attr value without escapes, from the parsed map or the raw text.
    pub fn attr_str(&self, key: &str) -> Option<&str> {
        if let Some(value) = self.parsed_attr(key) {
            return value.as_str();
        }
        let text = self.attrs_json.as_deref()?;
        if let Some(known) = self.numbers.string(text, key) {
            return known;
        }
        let raw = raw_value(text, key)?;
        let inner = raw.strip_prefix('"')?;
        let end = inner.find('"')?;
        let text = &inner[..end];
        (!text.contains('\\')).then_some(text)
    }

    /// A string Attr value, escapes and all (a file name with a quote or a backslash).
    pub fn attr_string(&self, key: &str) -> Option<std::borrow::Cow<'_, str>> {
        if let Some(plain) = self.attr_str(key) {
            return Some(plain.into());
        }
        if !self.attrs.is_empty() {
            return None;
        }
        let raw = raw_value(self.attrs_json.as_deref()?, key)?;
        let mut stream = serde_json::Deserializer::from_str(raw).into_iter::<String>();
        stream.next()?.ok().map(Into::into)
    }
}

/// `0x%016x`, as the original msMemScope prints pointers.
pub fn format_ptr(ptr: u64) -> String {
    format!("0x{ptr:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A row holding `text` as its Attr, with what the quick check learnt of it or without.
    fn attr_row(text: &str, cached: bool) -> EventRow {
        let mut row = EventRow::new(Event::Malloc, EventType::Pta, "");
        row.attrs_json = Some(text.to_string());
        if cached {
            if let Some(found) = super::super::attrs::plain_object(text) {
                row.numbers = AttrNumbers::of(row.attrs_json.as_deref().unwrap(), found);
            }
        }
        row
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]
        /// What the quick check keeps answers as the text does.
        #[test]
        fn cached_attrs_answer_as_the_text(
            parts in proptest::collection::vec(
                prop_oneof![
                    Just(r#""owner":"PTA@weight""#),
                    Just(r#""owner":"""#),
                    Just(r#""owner":7"#),
                    Just(r#""owner":["a"]"#),
                    Just(r#""size":64"#),
                    Just(r#""size":18446744073709551615"#),
                    Just(r#""x":"owner""#),
                    Just(r#""shape":[1,"owner"]"#),
                    Just(r#" "owner" : "spaced" "#),
                    Just(r#""site":"train.py:26 (<module>)""#),
                    Just(r#""site":3"#),
                    Just(r#""frame":"a.py:1 (f)""#),
                    Just(r#""op":"aten::addmm""#),
                    Just(r#""op":null"#),
                    Just(r#""x":"op""#),
                ],
                0..5,
            ),
        ) {
            let text = format!("{{{}}}", parts.join(","));
            let (cached, plain) = (attr_row(&text, true), attr_row(&text, false));
            for key in ["owner", "site", "frame", "op"] {
                prop_assert_eq!(cached.attr_str(key), plain.attr_str(key), "{} {}", key, text);
            }
            prop_assert_eq!(cached.attr_u64("size"), plain.attr_u64("size"), "{}", text);
        }
    }

    #[test]
    fn names_parse_back() {
        for e in Event::ALL {
            assert_eq!(Event::parse(e.as_str()), Some(e));
        }
        for t in EventType::ALL {
            assert_eq!(EventType::parse(t.as_str()), Some(t));
        }
        assert_eq!(Event::parse("malloc"), None);
        assert_eq!(EventType::parse("MARK"), None);
    }

    #[test]
    fn raw_attrs_are_read_without_parsing() {
        let mut row = EventRow::new(Event::Malloc, EventType::Pta, "");
        row.attrs_json = Some(
            r#"{"owner":"size","allocation_id": 7,"addr":"0x10","size":4096,"note":"a\"b"}"#.into(),
        );
        assert_eq!(row.attr_u64("size"), Some(4096));
        assert_eq!(row.attr_u64("allocation_id"), Some(7));
        assert_eq!(row.attr_str("addr"), Some("0x10"));
        assert_eq!(row.attr_str("owner"), Some("size"));
        assert_eq!(row.attr_u64("used"), None);
        assert_eq!(row.attr_str("note"), None);
        row.attrs.insert("used".into(), 5.into());
        assert_eq!(row.attr_u64("used"), Some(5));
    }
}
