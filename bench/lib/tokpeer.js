// The peer of bench/tokbench: Hugging Face's tokenizers library (npm
// `tokenizers`, the Rust core) encodes the same corpus.
// Usage: node tokpeer.js NODE_MODULES TOKENIZER_JSON CORPUS.jsonl IDS_OUT REPEAT
// Writes one line of space-separated ids per text to IDS_OUT (without special
// tokens added by the post-processor: addSpecialTokens false) and prints
// {"texts", "bytes", "tokens", "seconds"} with the best of REPEAT timed
// passes. Each pass is one encodeBatch call on one thread
// (RAYON_NUM_THREADS=1, set by the caller), so the figure is one core's
// speed plus the binding's cost of one call per pass.
'use strict';
const fs = require('fs');
const path = require('path');

async function main() {
  const [mods, tokFile, corpus, idsOut, repeatArg] = process.argv.slice(2);
  if (!idsOut) {
    console.error('usage: node tokpeer.js NODE_MODULES TOKENIZER_JSON CORPUS.jsonl IDS_OUT [REPEAT]');
    process.exit(2);
  }
  const { Tokenizer } = require(path.join(mods, 'tokenizers'));
  const repeat = Math.max(1, parseInt(repeatArg || '1', 10));
  const texts = fs.readFileSync(corpus, 'utf8').split('\n').filter((l) => l.length).map((l) => JSON.parse(l));
  const tok = Tokenizer.fromFile(tokFile);
  const opts = { addSpecialTokens: false };
  let best = Infinity;
  let first = null;
  for (let r = 0; r < repeat; r++) {
    const t0 = process.hrtime.bigint();
    const encs = await tok.encodeBatch(texts, opts);
    const ids = encs.map((e) => e.getIds());
    const dt = Number(process.hrtime.bigint() - t0) / 1e9;
    if (dt < best) best = dt;
    if (r === 0) first = ids;
  }
  let tokens = 0;
  const lines = first.map((ids) => {
    tokens += ids.length;
    return ids.join(' ');
  });
  fs.writeFileSync(idsOut, lines.join('\n') + '\n');
  const bytes = texts.reduce((a, t) => a + Buffer.byteLength(t, 'utf8'), 0);
  console.log(JSON.stringify({ texts: texts.length, bytes, tokens, seconds: best }));
}

main().catch((e) => {
  console.error('tokpeer.js: ' + (e && e.message ? e.message : e));
  process.exit(1);
});
