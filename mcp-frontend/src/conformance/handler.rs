//! The MCP handler of a build with the cargo feature `conformance`: the product's own
//! ([`SandboxRunServer`]), and around it the fixtures when the server was started with
//! `--conformance-fixtures`. Every request the fixtures do not answer goes to the product's
//! handler unchanged, and without the fixtures every request does: the build then behaves as the
//! default one.

use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelTaskParams, CompleteRequestParams,
    CompleteResult, CustomRequest, CustomResult, GetPromptRequestParams, GetPromptResponse,
    GetTaskParams, GetTaskResult, ListPromptsResult, ListResourceTemplatesResult,
    ListResourcesResult, ListToolsResult, PaginatedRequestParams, ReadResourceRequestParams,
    ReadResourceResponse, ServerConfig, SetLevelRequestParams, SubscribeRequestParams,
    SubscriptionFilter, Tool, UnsubscribeRequestParams, UpdateTaskParams,
};
use rmcp::service::{RequestContext, SubscriptionContext};
use rmcp::{ErrorData, RoleServer, ServerHandler};

use super::{Caller, Fixtures};
use crate::server::SandboxRunServer;

/// The product's handler, with the fixtures of its `Shared` state when there are any.
#[derive(Clone)]
pub struct WithFixtures {
    product: SandboxRunServer,
}

impl WithFixtures {
    /// Wraps the handler of one session (or stateless request).
    pub fn new(product: SandboxRunServer) -> Self {
        Self { product }
    }

    fn fixtures(&self) -> Option<&Arc<Fixtures>> {
        self.product.shared.fixtures.as_ref()
    }
}

impl ServerHandler for WithFixtures {
    fn get_info(&self) -> ServerConfig {
        match self.fixtures() {
            Some(fixtures) => fixtures.server_config(self.product.instructions()),
            None => self.product.get_info(),
        }
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let mut list = self.product.list_tools(request, context).await?;
        if let Some(fixtures) = self.fixtures() {
            list.tools.extend(fixtures.tools());
        }
        Ok(list)
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.fixtures()
            .and_then(|fixtures| fixtures.tool(name))
            .or_else(|| self.product.get_tool(name))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        match self.fixtures() {
            Some(fixtures) if fixtures.has_tool(&request.name) => {
                let caller = Caller {
                    agent: self.product.caller(&context),
                    log_level: &self.product.log_level,
                    tasks: &self.product.shared.tasks,
                };
                fixtures.call_tool(caller, request, context).await
            }
            _ => self.product.call_tool(request, context).await,
        }
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        self.product.get_task(request, context).await
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.product.cancel_task(request, context).await
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.product.update_task(request, context).await
    }

    async fn on_custom_request(
        &self,
        request: CustomRequest,
        context: RequestContext<RoleServer>,
    ) -> Result<CustomResult, ErrorData> {
        self.product.on_custom_request(request, context).await
    }

    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.product.set_level(request, context).await
    }

    async fn list_prompts(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        let mut list = self.product.list_prompts(request, context).await?;
        if let Some(fixtures) = self.fixtures() {
            list.prompts.extend(fixtures.prompts());
        }
        Ok(list)
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        match self.fixtures() {
            Some(fixtures) => fixtures.get_prompt(request),
            None => self.product.get_prompt(request, context).await,
        }
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let mut list = self.product.list_resources(request, context).await?;
        if let Some(fixtures) = self.fixtures() {
            list.resources.extend(fixtures.resources());
        }
        Ok(list)
    }

    async fn list_resource_templates(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        let mut list = self
            .product
            .list_resource_templates(request, context)
            .await?;
        if let Some(fixtures) = self.fixtures() {
            list.resource_templates
                .extend(fixtures.resource_templates());
        }
        Ok(list)
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        match self.fixtures().and_then(|f| f.read_resource(&request.uri)) {
            Some(read) => Ok(read),
            None => self.product.read_resource(request, context).await,
        }
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, ErrorData> {
        match self.fixtures() {
            Some(fixtures) => fixtures.complete(&request),
            None => self.product.complete(request, context).await,
        }
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        match self.fixtures() {
            // Everything the fixtures declare (rmcp narrows it to what was asked for).
            Some(_) => Some(requested.supported_by(&self.get_info().capabilities)),
            None => self.product.accepted_subscription_filter(requested),
        }
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), ErrorData> {
        match self.fixtures() {
            Some(fixtures) => fixtures.listen(context).await,
            None => self.product.listen(context).await,
        }
    }

    // The fixture resources never change, so a 2025-11-25 subscription is accepted and never
    // has an update to send.
    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        match self.fixtures() {
            Some(_) => Ok(()),
            None => self.product.subscribe(request, context).await,
        }
    }

    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        match self.fixtures() {
            Some(_) => Ok(()),
            None => self.product.unsubscribe(request, context).await,
        }
    }
}
