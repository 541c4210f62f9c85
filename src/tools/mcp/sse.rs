//! A bounded reader of `text/event-stream` bodies (the SSE answers of the Streamable HTTP
//! transport; the WHATWG "server-sent events" parsing rules, reduced to what MCP uses).
//!
//! Owns: splitting bytes into events (lines end in LF, CRLF or CR; `data:` lines join with LF;
//! a blank line dispatches; `:` starts a comment; an event unfinished at the end of the stream
//! is dropped). Must not: keep more than its bound of any one event: a bigger event is reported
//! as [`SseEvent::Oversize`], its bytes dropped as they come.

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SseEvent {
    /// An event with data (`event` is `message` unless the stream named another type).
    Message {
        /// The `event:` field.
        event: String,
        /// The joined `data:` lines.
        data: Vec<u8>,
    },
    /// An event whose data passed the bound; its data was dropped.
    Oversize,
}

/// Incremental parser: feed it chunks as they arrive.
#[derive(Debug)]
pub struct SseParser {
    max: usize,
    line: Vec<u8>,
    line_over: bool,
    after_cr: bool,
    data: Vec<u8>,
    data_over: bool,
    has_data: bool,
    event: String,
}

impl SseParser {
    /// A parser keeping at most `max` bytes of one event's data.
    pub fn new(max: usize) -> SseParser {
        SseParser {
            max,
            line: Vec::new(),
            line_over: false,
            after_cr: false,
            data: Vec::new(),
            data_over: false,
            has_data: false,
            event: String::new(),
        }
    }

    /// Parses `chunk`, appending each event it completes to `out`.
    pub fn feed(&mut self, chunk: &[u8], out: &mut Vec<SseEvent>) {
        for &byte in chunk {
            match byte {
                b'\n' if self.after_cr => self.after_cr = false,
                b'\n' => self.end_line(out),
                b'\r' => {
                    self.end_line(out);
                    self.after_cr = true;
                }
                _ => {
                    self.after_cr = false;
                    // A line may carry a field name and a separator besides the data.
                    if self.line.len() < self.max.saturating_add(64) {
                        self.line.push(byte);
                    } else {
                        self.line_over = true;
                    }
                }
            }
        }
    }

    fn end_line(&mut self, out: &mut Vec<SseEvent>) {
        let line = std::mem::take(&mut self.line);
        let over = std::mem::replace(&mut self.line_over, false);
        if line.is_empty() && !over {
            self.dispatch(out);
            return;
        }
        if line.first() == Some(&b':') {
            return;
        }
        let (field, value) = match line.iter().position(|b| *b == b':') {
            Some(at) => {
                let value = &line[at + 1..];
                (&line[..at], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (&line[..], &[][..]),
        };
        match field {
            b"data" => {
                if self.has_data {
                    self.push_data(b"\n");
                }
                self.has_data = true;
                self.push_data(value);
                if over {
                    self.data_over = true;
                }
            }
            b"event" => self.event = String::from_utf8_lossy(value).into_owned(),
            _ => {}
        }
    }

    fn push_data(&mut self, bytes: &[u8]) {
        if self.data_over || self.data.len() + bytes.len() > self.max {
            self.data_over = true;
            self.data.clear();
        } else {
            self.data.extend_from_slice(bytes);
        }
    }

    fn dispatch(&mut self, out: &mut Vec<SseEvent>) {
        let event = std::mem::take(&mut self.event);
        let data = std::mem::take(&mut self.data);
        let over = std::mem::replace(&mut self.data_over, false);
        if !std::mem::replace(&mut self.has_data, false) {
            return;
        }
        out.push(if over {
            SseEvent::Oversize
        } else {
            SseEvent::Message {
                event: if event.is_empty() {
                    "message".to_string()
                } else {
                    event
                },
                data,
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(max: usize, chunks: &[&[u8]]) -> Vec<SseEvent> {
        let mut p = SseParser::new(max);
        let mut out = Vec::new();
        for c in chunks {
            p.feed(c, &mut out);
        }
        out
    }

    fn message(data: &str) -> SseEvent {
        SseEvent::Message {
            event: "message".into(),
            data: data.as_bytes().to_vec(),
        }
    }

    #[test]
    fn events_split_on_blank_lines_whatever_the_line_endings_and_chunks() {
        let body = b": hello\nevent: message\ndata: {\"a\":\r\ndata: 1}\r\n\r\nid: 7\rdata:x\r\rdata: unfinished";
        for split in 0..body.len() {
            let (a, b) = body.split_at(split);
            assert_eq!(
                parse(1024, &[a, b]),
                [message("{\"a\":\n1}"), message("x")],
                "split at {split}"
            );
        }
    }

    #[test]
    fn an_event_over_the_bound_is_reported_oversize_and_the_next_one_read() {
        let big = format!("data: {}\n\ndata: ok\n\n", "x".repeat(100));
        assert_eq!(
            parse(50, &[big.as_bytes()]),
            [SseEvent::Oversize, message("ok")]
        );
        let many = format!("{}\ndata: ok\n\n", "data: xxxxxxxxxx\n".repeat(10));
        assert_eq!(
            parse(50, &[many.as_bytes()]),
            [SseEvent::Oversize, message("ok")]
        );
    }

    #[test]
    fn a_named_event_keeps_its_type_and_an_event_without_data_is_not_dispatched() {
        assert_eq!(
            parse(64, &[b"event: ping\n\nevent: other\ndata: 1\n\n"]),
            [SseEvent::Message {
                event: "other".into(),
                data: b"1".to_vec()
            }]
        );
    }
}
