//! Unit tests for the SSE parser: each line-ending style, every split point,
//! comments, field edge cases and the size limit.

use super::*;

fn event(data: &str) -> SseEvent {
    SseEvent { event: None, data: data.to_owned(), id: None }
}

fn parse_all(input: &[u8]) -> Vec<SseEvent> {
    let mut parser = SseParser::new();
    parser.feed(input).unwrap_or_else(|e| panic!("{e}"))
}

/// Feeds `input` split at every possible pair of points and checks that the
/// result never depends on where the network cut the bytes.
fn assert_split_invariant(input: &[u8], expected: &[SseEvent]) {
    for first in 0..=input.len() {
        for second in first..=input.len() {
            let mut parser = SseParser::new();
            let mut events = Vec::new();
            for piece in [&input[..first], &input[first..second], &input[second..]] {
                events.extend(parser.feed(piece).unwrap_or_else(|e| panic!("{e}")));
            }
            assert_eq!(events, expected, "split at {first} and {second}");
        }
    }
}

#[test]
fn lf_crlf_and_cr_line_endings_all_end_lines() {
    let expected = vec![event("a"), event("b")];
    assert_eq!(parse_all(b"data: a\n\ndata: b\n\n"), expected);
    assert_eq!(parse_all(b"data: a\r\n\r\ndata: b\r\n\r\n"), expected);
    assert_eq!(parse_all(b"data: a\r\rdata: b\r\r"), expected);
    assert_eq!(parse_all(b"data: a\r\n\ndata: b\r\r\n"), expected);
}

#[test]
fn results_do_not_depend_on_chunk_boundaries() {
    let input = "event: delta\r\ndata: h\u{e9}llo \u{1F600}\r\nid: 7\r\n\r\ndata: x\rdata: y\r\r:c\ndata: z\n\n";
    let expected = vec![
        SseEvent { event: Some("delta".into()), data: "h\u{e9}llo \u{1F600}".into(), id: Some("7".into()) },
        SseEvent { event: None, data: "x\ny".into(), id: Some("7".into()) },
        SseEvent { event: None, data: "z".into(), id: Some("7".into()) },
    ];
    assert_split_invariant(input.as_bytes(), &expected);
}

#[test]
fn crlf_split_between_cr_and_lf_is_one_terminator() {
    let mut parser = SseParser::new();
    let mut events = parser.feed(b"data: a\r").unwrap_or_default();
    events.extend(parser.feed(b"\n\r").unwrap_or_default());
    events.extend(parser.feed(b"\ndata: b\n\n").unwrap_or_default());
    assert_eq!(events, vec![event("a"), event("b")]);
}

#[test]
fn multiple_data_lines_are_joined_with_newlines() {
    assert_eq!(parse_all(b"data: one\ndata: two\ndata:\ndata: three\n\n"), vec![event("one\ntwo\n\nthree")]);
}

#[test]
fn comments_are_ignored_and_do_not_dispatch() {
    assert_eq!(parse_all(b": keep-alive\n\n: OPENROUTER PROCESSING\ndata: x\n\n"), vec![event("x")]);
}

#[test]
fn only_one_leading_space_is_removed() {
    assert_eq!(parse_all(b"data:  two spaces\n\ndata:none\n\n"), vec![event(" two spaces"), event("none")]);
}

#[test]
fn a_field_without_colon_has_an_empty_value() {
    // `data` alone appends an empty line; two of them make "\n".
    assert_eq!(parse_all(b"data\ndata\n\n"), vec![event("\n")]);
    // `event` alone resets nothing harmful and an event without data is dropped.
    assert_eq!(parse_all(b"event\n\n"), vec![]);
}

#[test]
fn unknown_fields_are_ignored_and_retry_is_kept() {
    let mut parser = SseParser::new();
    let events = parser.feed(b"foo: bar\nretry: 1500\nretry: soon\ndata: d\n\n").unwrap_or_default();
    assert_eq!(events, vec![event("d")]);
    assert_eq!(parser.retry_ms(), Some(1500));
}

#[test]
fn event_type_resets_after_each_event_but_id_persists() {
    let events = parse_all(b"event: a\nid: 1\ndata: x\n\ndata: y\n\nid\ndata: z\n\n");
    assert_eq!(
        events,
        vec![
            SseEvent { event: Some("a".into()), data: "x".into(), id: Some("1".into()) },
            SseEvent { event: None, data: "y".into(), id: Some("1".into()) },
            SseEvent { event: None, data: "z".into(), id: None },
        ]
    );
}

#[test]
fn an_id_containing_nul_is_ignored() {
    let events = parse_all(b"id: 1\ndata: a\n\nid: 2\0\ndata: b\n\n");
    assert_eq!(events[1].id.as_deref(), Some("1"));
}

#[test]
fn an_unterminated_event_is_not_dispatched() {
    let mut parser = SseParser::new();
    assert_eq!(parser.feed(b"data: partial\n").unwrap_or_default(), vec![]);
    assert_eq!(parser.feed(b"data: more").unwrap_or_default(), vec![]);
}

#[test]
fn a_leading_byte_order_mark_is_skipped_even_when_split() {
    let expected = vec![event("x")];
    assert_split_invariant(b"\xEF\xBB\xBFdata: x\n\n", &expected);
}

#[test]
fn invalid_utf8_is_replaced_not_fatal() {
    assert_eq!(parse_all(b"data: a\xFFb\n\n"), vec![event("a\u{FFFD}b")]);
}

#[test]
fn an_overlong_line_is_an_error() {
    let mut parser = SseParser::with_max_line_len(16);
    assert_eq!(parser.feed(b"data: 0123456789").map(|e| e.len()), Ok(0));
    assert_eq!(parser.feed(b"ABCDEF"), Err(SseError::TooLong { limit: 16 }));

    let mut parser = SseParser::with_max_line_len(16);
    assert_eq!(parser.feed(b"data: 0123456789ABCDEF\n"), Err(SseError::TooLong { limit: 16 }));
}

#[test]
fn an_overlong_event_made_of_short_lines_is_an_error() {
    let mut parser = SseParser::with_max_line_len(16);
    assert_eq!(parser.feed(b"data: 01234\ndata: 56789\n").map(|e| e.len()), Ok(0));
    assert_eq!(parser.feed(b"data: ABCDE\n"), Err(SseError::TooLong { limit: 16 }));
}
