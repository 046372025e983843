//! Tool-result images, split the same way for every adapter.
//!
//! History holds only [`ImageRef`]s; the bytes a model may see now come with
//! the request in [`ModelRequest::images`](crate::ModelRequest::images). An
//! image that is not there (expired from the runtime's image store, or its
//! tool no longer allows showing it) becomes a line of text after the tool's
//! output, so the model knows something was returned and why it cannot see
//! it. How the images that are there go on the wire is each adapter's
//! business, in its `request.rs`.

use std::borrow::Cow;
use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use keel_protocol::ImageRef;

use crate::ImageData;

/// A tool output ready to send: its text and the images to attach.
#[derive(Debug)]
pub(crate) struct ToolOutput<'a> {
    /// The output, then one placeholder line per image that cannot be sent.
    /// Borrowed when every image can be sent.
    pub text: Cow<'a, str>,
    /// The images to attach, in the order the tool returned them.
    pub attached: Vec<&'a ImageData>,
}

/// Splits `refs` into the images found in `available` and placeholders for
/// the others, appended to `output`.
pub(crate) fn tool_output<'a>(
    output: &'a str,
    refs: &[ImageRef],
    available: &'a BTreeMap<String, ImageData>,
) -> ToolOutput<'a> {
    let mut text = Cow::Borrowed(output);
    let mut attached = Vec::with_capacity(refs.len());
    for image in refs {
        match available.get(&image.id) {
            Some(data) => attached.push(data),
            None => {
                let text = text.to_mut();
                if !text.is_empty() {
                    text.push('\n');
                }
                text.push_str(&unavailable_placeholder(image));
            }
        }
    }
    ToolOutput { text, attached }
}

/// What the model reads in place of an image it cannot be shown.
pub(crate) fn unavailable_placeholder(image: &ImageRef) -> String {
    format!("[image {} ({}) is no longer available]", image.id, image.mime_type)
}

/// The image's bytes in standard, padded base64.
pub(crate) fn base64_data(image: &ImageData) -> String {
    STANDARD.encode(&image.data)
}

/// The image as a `data:<mime>;base64,<data>` URL, the form both OpenAI APIs
/// take for inline images.
pub(crate) fn data_url(image: &ImageData) -> String {
    format!("data:{};base64,{}", image.mime_type, base64_data(image))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image_ref(id: &str) -> ImageRef {
        ImageRef { id: id.into(), mime_type: "image/png".into(), bytes: 3 }
    }

    #[test]
    fn available_images_are_attached_and_the_others_become_placeholder_lines() {
        let png = ImageData { mime_type: "image/png".into(), data: vec![1u8, 2, 3].into() };
        let available = BTreeMap::from([("img_1".to_string(), png.clone())]);
        let refs = [image_ref("img_1"), image_ref("img_2"), image_ref("img_3")];
        let split = tool_output("shot taken", &refs, &available);
        assert_eq!(
            split.text,
            "shot taken\n[image img_2 (image/png) is no longer available]\n\
             [image img_3 (image/png) is no longer available]"
        );
        assert_eq!(split.attached, vec![&png]);
        assert_eq!(data_url(&png), "data:image/png;base64,AQID");
    }

    #[test]
    fn an_empty_output_gets_no_leading_line_break_and_no_images_borrow_the_text() {
        let none = BTreeMap::new();
        let split = tool_output("", &[image_ref("img_9")], &none);
        assert_eq!(split.text, "[image img_9 (image/png) is no longer available]");
        assert!(matches!(tool_output("ok", &[], &none).text, Cow::Borrowed("ok")));
    }
}
