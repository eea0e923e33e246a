//! The fixture resources, resource template and prompts, and completion of their arguments.

use rmcp::ErrorData;
use rmcp::model::{
    CompleteRequestParams, CompleteResult, CompletionInfo, ContentBlock, GetPromptRequestParams,
    GetPromptResponse, GetPromptResult, ImageContent, Prompt, PromptArgument, PromptMessage,
    ReadResourceResponse, ReadResourceResult, Reference, Resource, ResourceContents,
    ResourceTemplate, Role,
};

use super::{IMAGE_PNG, input_required, string_arg};

const STATIC_TEXT: &str = "test://static-text";
const STATIC_BINARY: &str = "test://static-binary";
/// `test://template/{id}/data`, split around its one parameter.
const TEMPLATE_PREFIX: &str = "test://template/";
const TEMPLATE_SUFFIX: &str = "/data";

pub(super) fn resources() -> Vec<Resource> {
    vec![
        Resource::new(STATIC_TEXT, "Static Text Resource")
            .with_description("A static text resource for testing")
            .with_mime_type("text/plain"),
        Resource::new(STATIC_BINARY, "Static Binary Resource")
            .with_description("A static binary/blob resource for testing")
            .with_mime_type("image/png"),
    ]
}

pub(super) fn resource_templates() -> Vec<ResourceTemplate> {
    vec![
        ResourceTemplate::new(
            format!("{TEMPLATE_PREFIX}{{id}}{TEMPLATE_SUFFIX}"),
            "Dynamic Resource",
        )
        .with_description("A dynamic resource with parameter substitution")
        .with_mime_type("application/json"),
    ]
}

/// `resources/read` of a fixture resource; `None` for any other URI.
pub(super) fn read_resource(uri: &str) -> Option<ReadResourceResponse> {
    let contents = match uri {
        STATIC_TEXT => ResourceContents::TextResourceContents {
            uri: uri.into(),
            mime_type: Some("text/plain".into()),
            text: "This is the content of the static text resource.".into(),
            meta: None,
        },
        STATIC_BINARY => ResourceContents::BlobResourceContents {
            uri: uri.into(),
            mime_type: Some("image/png".into()),
            blob: IMAGE_PNG.into(),
            meta: None,
        },
        _ => {
            let id = uri
                .strip_prefix(TEMPLATE_PREFIX)?
                .strip_suffix(TEMPLATE_SUFFIX)
                .filter(|id| !id.is_empty() && !id.contains('/'))?;
            let data = serde_json::json!({
                "id": id,
                "templateTest": true,
                "data": format!("Data for ID: {id}"),
            });
            ResourceContents::TextResourceContents {
                uri: uri.into(),
                mime_type: Some("application/json".into()),
                text: data.to_string(),
                meta: None,
            }
        }
    };
    Some(ReadResourceResult::new(vec![contents]).into())
}

pub(super) fn prompts() -> Vec<Prompt> {
    vec![
        Prompt::new(
            "test_simple_prompt",
            Some("A simple test prompt with no arguments"),
            None,
        ),
        Prompt::new(
            "test_prompt_with_arguments",
            Some("A test prompt that accepts arguments"),
            Some(vec![
                PromptArgument::new("arg1")
                    .with_description("First test argument")
                    .with_required(true),
                PromptArgument::new("arg2")
                    .with_description("Second test argument")
                    .with_required(false),
            ]),
        ),
        Prompt::new(
            "test_prompt_with_embedded_resource",
            Some("A test prompt that includes an embedded resource"),
            None,
        ),
        Prompt::new(
            "test_prompt_with_image",
            Some("A test prompt that includes an image"),
            None,
        ),
        Prompt::new(
            input_required::PROMPT,
            Some("A prompt that needs an elicitation answer (SEP-2322)"),
            None,
        ),
    ]
}

/// `prompts/get` of a fixture prompt other than the input-required one.
pub(super) fn get_prompt(request: GetPromptRequestParams) -> Result<GetPromptResponse, ErrorData> {
    let result = match request.name.as_str() {
        "test_simple_prompt" => GetPromptResult::new(vec![PromptMessage::new_text(
            Role::User,
            "This is a simple test prompt.",
        )])
        .with_description("A simple test prompt"),
        "test_prompt_with_arguments" => {
            let args = request.arguments.unwrap_or_default();
            let arg1 = string_arg(&args, "arg1").unwrap_or("");
            let arg2 = string_arg(&args, "arg2").unwrap_or("");
            GetPromptResult::new(vec![PromptMessage::new_text(
                Role::User,
                format!("Prompt with arguments: arg1='{arg1}', arg2='{arg2}'"),
            )])
            .with_description("A prompt with arguments")
        }
        "test_prompt_with_embedded_resource" => GetPromptResult::new(vec![
            PromptMessage::new_text(Role::User, "Here is a resource:"),
            PromptMessage::new_resource(
                Role::User,
                STATIC_TEXT.into(),
                Some("text/plain".into()),
                Some("Resource content for prompt".into()),
                None,
                None,
                None,
            ),
        ])
        .with_description("A prompt with an embedded resource"),
        "test_prompt_with_image" => GetPromptResult::new(vec![
            PromptMessage::new_text(Role::User, "Here is an image:"),
            PromptMessage::new(
                Role::User,
                ContentBlock::Image(ImageContent::new(IMAGE_PNG, "image/png")),
            ),
        ])
        .with_description("A prompt with an image"),
        other => {
            let known: Vec<String> = prompts().into_iter().map(|p| p.name).collect();
            return Err(ErrorData::invalid_params(
                format!(
                    "unknown prompt `{other}`; this server offers: {}",
                    known.join(", ")
                ),
                None,
            ));
        }
    };
    Ok(result.into())
}

/// Completion values: the template's ids, and names or styles for prompt arguments.
pub(super) fn complete(request: &CompleteRequestParams) -> Result<CompleteResult, ErrorData> {
    let values: Vec<String> = match (&request.r#ref, request.argument.name.as_str()) {
        (Reference::Resource(_), "id") => vec!["1".into(), "2".into(), "3".into()],
        (Reference::Resource(_), _) => Vec::new(),
        (Reference::Prompt(_), "name") => vec!["Alice".into(), "Bob".into(), "Charlie".into()],
        (Reference::Prompt(_), "style") => {
            vec!["friendly".into(), "formal".into(), "casual".into()]
        }
        (Reference::Prompt(prompt), _) => vec![prompt.name.clone()],
        _ => Vec::new(),
    };
    let prefix = request.argument.value.as_str();
    let values = values
        .into_iter()
        .filter(|v| v.starts_with(prefix) || prefix.is_empty())
        .collect::<Vec<_>>();
    Ok(CompleteResult::new(
        CompletionInfo::new(values).map_err(|e| ErrorData::internal_error(e, None))?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::ReadResourceResponse;

    fn text_of(uri: &str) -> Option<String> {
        match read_resource(uri)? {
            ReadResourceResponse::Complete(result) => match &result.contents[..] {
                [ResourceContents::TextResourceContents { text, .. }] => Some(text.clone()),
                other => panic!("one text content expected, got {other:?}"),
            },
            other => panic!("a complete result expected, got {other:?}"),
        }
    }

    #[test]
    fn the_template_reads_any_one_segment_id_and_nothing_else() {
        let data: serde_json::Value =
            serde_json::from_str(&text_of("test://template/123/data").unwrap()).unwrap();
        assert_eq!(data["id"], "123");
        assert_eq!(data["templateTest"], true);
        for uri in [
            "test://template//data",
            "test://template/1/2/data",
            "test://template/123",
            "test://nonexistent-resource-for-conformance-testing",
            "sandboxrun://databases/x/schema",
        ] {
            assert_eq!(text_of(uri), None, "{uri}");
        }
        assert!(
            text_of(STATIC_TEXT)
                .unwrap()
                .contains("static text resource")
        );
    }
}
