//! Splitting scripted text into the pieces a stream sends: one delta per
//! word for answers, three fragments for tool-call arguments, always at
//! character boundaries, so clients are tested on reassembly.

/// Splits text into streaming deltas: one per word (a word keeps its
/// leading whitespace), or three pieces of a single word.
pub(crate) fn split_text(text: &str) -> Vec<String> {
    let mut pieces = Vec::new();
    let mut start = 0;
    for (index, ch) in text.char_indices().skip(1) {
        if ch.is_whitespace() && !text[..index].ends_with(char::is_whitespace) {
            pieces.push(text[start..index].to_owned());
            start = index;
        }
    }
    if start < text.len() {
        pieces.push(text[start..].to_owned());
    }
    if pieces.len() == 1 { split_in_three(text) } else { pieces }
}

/// Splits `text` at char boundaries into three non-empty pieces, or fewer
/// when it has fewer than three characters.
pub(crate) fn split_in_three(text: &str) -> Vec<String> {
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    if chars.len() < 3 {
        return chars.iter().map(|(_, c)| c.to_string()).collect();
    }
    let first = chars[chars.len() / 3].0;
    let second = chars[2 * chars.len() / 3].0;
    vec![text[..first].to_owned(), text[first..second].to_owned(), text[second..].to_owned()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_splits_into_words_or_word_pieces() {
        assert_eq!(split_text("Hello from keel"), vec!["Hello", " from", " keel"]);
        assert_eq!(split_text("a  b\n"), vec!["a", "  b", "\n"]);
        assert_eq!(split_text("hello"), vec!["h", "el", "lo"]);
        assert_eq!(split_text("hé"), vec!["h", "é"]);
        assert_eq!(split_text(""), Vec::<String>::new());
    }

    #[test]
    fn arguments_split_into_three_pieces_at_char_boundaries() {
        assert_eq!(split_in_three(r#"{"a":1}"#).concat(), r#"{"a":1}"#);
        assert_eq!(split_in_three(r#"{"a":1}"#).len(), 3);
        assert_eq!(split_in_three("日本語です"), vec!["日", "本語", "です"]);
    }
}
