// Totals of one `conformance server -o DIR` run, read from the checks.json of each scenario the
// suite wrote: one line per scenario, the totals, and every failing check with the suite's own
// reason. Exits 1 when any check failed, whether the revision scores the scenario or not (the
// tasks extension and pending scenarios are not scored, and we want them green too).
//
// Usage: node summarize.mjs LABEL DIR [--only PREFIX | --except PREFIX] [--fixtures-absent]
//
// --only / --except PREFIX: the scenarios whose names start (or do not start) with PREFIX, to
// report the tasks extension (tasks-*) apart from the rest of the run it is part of.
//
// --fixtures-absent: for the default build, which has none of the suite's diagnostic tools. A
// check the suite itself reports as "Not testable: ..." because a fixture is missing (its
// details say `untestable`) is listed apart and does not fail the run; any other failure does.

import fs from "node:fs";
import path from "node:path";

const [label, dir, ...flags] = process.argv.slice(2);
const fixturesAbsent = flags.includes("--fixtures-absent");
const flagValue = (name) => (flags.includes(name) ? flags[flags.indexOf(name) + 1] : undefined);
const only = flagValue("--only");
const except = flagValue("--except");
if (!label || !dir) {
  console.error("usage: node summarize.mjs LABEL DIR [--only PREFIX | --except PREFIX] [--fixtures-absent]");
  process.exit(2);
}
const selected = (name) =>
  (only === undefined || name.startsWith(only)) && (except === undefined || !name.startsWith(except));

// server-<scenario>-<ISO time with : and . as ->
const scenarioOf = (name) => name.replace(/^server-/, "").replace(/-\d{4}-\d\d-\d\dT[\d-]+Z$/, "");
const untestable = (c) =>
  c.status === "FAILURE" && c.details?.untestable === true && /^Not testable:/.test(c.errorMessage ?? "");

const scenarios = fs
  .readdirSync(dir, { withFileTypes: true })
  .filter((e) => e.isDirectory() && fs.existsSync(path.join(dir, e.name, "checks.json")))
  .map((e) => ({
    name: scenarioOf(e.name),
    checks: JSON.parse(fs.readFileSync(path.join(dir, e.name, "checks.json"), "utf8")),
  }))
  .filter((s) => selected(s.name))
  .sort((a, b) => a.name.localeCompare(b.name));

if (scenarios.length === 0) {
  console.log(`${label}: the suite wrote no results for these scenarios to ${dir}`);
  process.exit(1);
}

let passed = 0;
let failed = 0;
let checks = { passed: 0, failed: 0, warnings: 0, notTestable: 0 };
const failures = [];
const notTestable = [];
for (const s of scenarios) {
  const hard = s.checks.filter((c) => c.status === "FAILURE" && !(fixturesAbsent && untestable(c)));
  const soft = s.checks.filter((c) => fixturesAbsent && untestable(c));
  checks.passed += s.checks.filter((c) => c.status === "SUCCESS").length;
  checks.warnings += s.checks.filter((c) => c.status === "WARNING").length;
  checks.failed += hard.length;
  checks.notTestable += soft.length;
  if (hard.length > 0) failed += 1;
  else passed += 1;
  for (const c of hard) failures.push(`${s.name}: ${c.id}: ${c.errorMessage ?? c.description}`);
  for (const c of soft) notTestable.push(`${s.name}: ${c.id}: ${c.errorMessage}`);
  const mark = hard.length > 0 ? "FAIL" : "ok  ";
  console.log(`  ${mark} ${s.name}`);
}
console.log(
  `${label}: ${scenarios.length} scenarios, ${passed} passed, ${failed} failed ` +
    `(checks: ${checks.passed} passed, ${checks.failed} failed, ${checks.warnings} warnings` +
    (fixturesAbsent ? `, ${checks.notTestable} not testable without the fixtures` : "") +
    ")",
);
if (notTestable.length > 0) {
  console.log(`${label}: not testable without the fixtures (the conformance build covers them):`);
  for (const line of notTestable) console.log(`  - ${line}`);
}
if (failures.length > 0) {
  console.log(`${label}: failing checks:`);
  for (const line of failures) console.log(`  - ${line}`);
  process.exit(1);
}
