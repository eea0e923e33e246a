// A real OAuth 2.1 authorization server for the client tests: panva's oidc-provider, run on
// loopback, with open dynamic client registration, authorization code + PKCE (S256), resource
// indicators (RFC 8707) that yield JWT access tokens whose `aud` is the requested resource, and
// the client_credentials grant. Only the user is automated: GET /interaction/:uid logs in a
// fixed test account and grants what the client asked for, so a client following redirects
// gets the code back at its redirect_uri as after a user's click.
//
//   node provider.mjs --port 9000 --jwks keys.json [--host 127.0.0.1] [--account alice] [--provider-dir DIR]
//
// keys.json is a JWK Set with PRIVATE keys (each with a `kid`; the first key's `alg`, default
// RS256, signs access tokens). The issuer is http://<host>:<port> (the cluster tests listen on
// the node's bridge address, e2e/oauth/start.sh). One static confidential
// client is configured for client_credentials: id `svc`, secret `svc-secret`. Prints
// `ready <issuer>` on stdout once it listens. Restarting on the same port with another key file
// is a key rotation: the old keys are gone from jwks_uri.
//
// Runs on run.sh's Node 22 ($OIDC_NODE) with the oidc-provider run.sh installs into
// $OIDC_PROVIDER_DIR (--provider-dir, default $OIDC_PROVIDER_DIR, else the usual module resolution).

import { readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { parseArgs } from 'node:util';
import { createRequire } from 'node:module';
import { pathToFileURL } from 'node:url';
import path from 'node:path';

const { values: args } = parseArgs({
  options: {
    port: { type: 'string' },
    host: { type: 'string', default: '127.0.0.1' },
    jwks: { type: 'string' },
    account: { type: 'string', default: process.env.OIDC_ACCOUNT || 'alice' },
    'provider-dir': { type: 'string', default: process.env.OIDC_PROVIDER_DIR || '' },
  },
});
if (!args.port || !args.jwks) {
  console.error('usage: provider.mjs --port N --jwks FILE [--host ADDR] [--account ID] [--provider-dir DIR]');
  process.exit(2);
}

// oidc-provider lives in the test cache, not next to this file.
async function loadProvider() {
  if (args['provider-dir']) {
    const req = createRequire(path.join(args['provider-dir'], 'package.json'));
    return (await import(pathToFileURL(req.resolve('oidc-provider')).href)).default;
  }
  return (await import('oidc-provider')).default;
}
const Provider = await loadProvider();

const port = Number(args.port);
const issuer = `http://${args.host}:${port}`;
const jwks = JSON.parse(readFileSync(args.jwks, 'utf8'));
const signingAlg = jwks.keys[0].alg || 'RS256';
const accountId = args.account;

// What every resource server (any http(s) resource indicator) may be granted. They are listed
// as the provider's scopes too: dynamic registration accepts only those in a client's `scope`,
// and the SDK registers with the scopes it is about to request.
const RESOURCE_SCOPES = [
  'sandboxrun:run_python',
  'sandboxrun:execute_sql',
  'sandboxrun:fetch_metrics',
  'sandboxrun:staging',
  'sandboxrun:production',
];

const provider = new Provider(issuer, {
  jwks,
  clients: [{
    client_id: 'svc',
    client_secret: 'svc-secret',
    grant_types: ['client_credentials'],
    redirect_uris: [],
    response_types: [],
    token_endpoint_auth_method: 'client_secret_post',
  }],
  clientDefaults: {
    grant_types: ['authorization_code'],
    id_token_signed_response_alg: signingAlg,
    response_types: ['code'],
    token_endpoint_auth_method: 'client_secret_basic',
  },
  cookies: { keys: ['sandboxrun-test-cookie-key'] },
  findAccount: async (ctx, sub) => ({ accountId: sub, claims: async () => ({ sub }) }),
  pkce: { required: () => true },
  responseTypes: ['code'],
  scopes: ['openid', 'offline_access', ...RESOURCE_SCOPES],
  interactions: { url: (ctx, interaction) => `/interaction/${interaction.uid}` },
  features: {
    devInteractions: { enabled: false },
    registration: { enabled: true },
    clientCredentials: { enabled: true },
    revocation: { enabled: true },
    introspection: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: async (ctx, client, oneOf) => oneOf ?? undefined,
      useGrantedResource: async () => true,
      getResourceServerInfo: async (ctx, resourceIndicator) => {
        const url = new URL(resourceIndicator);
        if (url.protocol !== 'http:' && url.protocol !== 'https:') {
          throw new Provider.errors.InvalidTarget();
        }
        return {
          scope: RESOURCE_SCOPES.join(' '),
          audience: resourceIndicator,
          accessTokenTTL: 10 * 60,
          accessTokenFormat: 'jwt',
          jwt: { sign: { alg: signingAlg } },
        };
      },
    },
  },
  ttl: {
    AccessToken: 10 * 60,
    AuthorizationCode: 60,
    ClientCredentials: 10 * 60,
    Grant: 60 * 60,
    IdToken: 10 * 60,
    Interaction: 10 * 60,
    RefreshToken: 60 * 60,
    Session: 60 * 60,
  },
});
provider.on('server_error', (ctx, err) => console.error('server_error', err));

// The automated user: log in `accountId`, then consent to everything the client asked for.
async function interaction(req, res) {
  const details = await provider.interactionDetails(req, res);
  const { prompt, params } = details;
  let result;
  if (prompt.name === 'login') {
    result = { login: { accountId } };
  } else if (prompt.name === 'consent') {
    const grant = details.grantId
      ? await provider.Grant.find(details.grantId)
      : new provider.Grant({ accountId, clientId: params.client_id });
    const { missingOIDCScope, missingOIDCClaims, missingResourceScopes } = prompt.details;
    if (missingOIDCScope) grant.addOIDCScope(missingOIDCScope.join(' '));
    if (missingOIDCClaims) grant.addOIDCClaims(missingOIDCClaims);
    for (const [indicator, scopes] of Object.entries(missingResourceScopes || {})) {
      grant.addResourceScope(indicator, scopes.join(' '));
    }
    result = { consent: { grantId: await grant.save() } };
  } else {
    result = { error: 'access_denied', error_description: `unhandled prompt ${prompt.name}` };
  }
  await provider.interactionFinished(req, res, result, { mergeWithLastSubmission: true });
}

const callback = provider.callback();
const server = createServer((req, res) => {
  if (req.method === 'GET' && /^\/interaction\/[^/?]+/.test(req.url)) {
    interaction(req, res).catch((err) => {
      console.error('interaction failed', err);
      if (!res.headersSent) {
        res.writeHead(500, { 'content-type': 'text/plain' });
      }
      res.end(String(err));
    });
    return;
  }
  callback(req, res);
});
// Node closes an idle keep-alive connection after 5 s by default, and a client that reuses it in
// that very moment gets "Server disconnected without sending a response" (the SDK's OAuth flow
// reuses its client's connection to the token endpoint after the browser's round, which took
// about 5 s once on a loaded machine). Idle connections are kept longer than any test runs, so
// the race cannot happen; real clients retry such a request, this test's cannot.
server.keepAliveTimeout = 120_000;
server.headersTimeout = 125_000;
server.listen(port, args.host, () => {
  console.log(`ready ${issuer}`);
});
for (const signal of ['SIGTERM', 'SIGINT']) {
  process.on(signal, () => {
    server.close(() => process.exit(0));
    server.closeAllConnections();
  });
}
