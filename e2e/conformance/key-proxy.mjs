// Puts sandboxrun's API key on every request of the MCP conformance suite, and changes nothing else.
//
// Why a proxy: `conformance server` has no option for request headers (its options are --url,
// --scenario, --suite, --requirements, --spec-version, --expected-failures, --timeout, -o,
// --force, --verbose), and sandboxrun-mcp refuses every MCP request without a credential, by
// design. Host and Origin pass through exactly as the suite sent them (the DNS-rebinding
// scenario sends foreign ones on purpose), and bodies and event streams are piped unbuffered both
// ways (the SSE scenarios read streams that stay open).
//
// Usage: SANDBOXRUN_CONFORMANCE_KEY=<key> node key-proxy.mjs <server port>
// Prints the port it listens on (127.0.0.1, chosen by the kernel), then serves until killed.

import http from "node:http";

const target = Number(process.argv[2]);
const key = process.env.SANDBOXRUN_CONFORMANCE_KEY;
if (!Number.isInteger(target) || target <= 0 || !key) {
  console.error("usage: SANDBOXRUN_CONFORMANCE_KEY=<key> node key-proxy.mjs <server port>");
  process.exit(2);
}

const proxy = http.createServer((req, res) => {
  const headers = { ...req.headers, authorization: `Bearer ${key}` };
  const upstream = http.request(
    { host: "127.0.0.1", port: target, method: req.method, path: req.url, headers },
    (answer) => {
      res.writeHead(answer.statusCode, answer.headers);
      answer.pipe(res);
    },
  );
  upstream.on("error", (e) => {
    if (!res.headersSent) res.writeHead(502, { "content-type": "text/plain" });
    res.end(`key-proxy: sandboxrun-mcp did not answer: ${e.message}\n`);
  });
  // A client that hangs up (the suite closes SSE streams it has read enough of) closes the
  // request upstream too, as it would have without the proxy.
  res.on("close", () => upstream.destroy());
  req.pipe(upstream);
});

proxy.listen(0, "127.0.0.1", () => console.log(proxy.address().port));
