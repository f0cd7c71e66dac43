// bench-hf.js - load time and single-thread encode throughput of Hugging
// Face's Rust tokenizers (npm tokenizers@0.23.2, the oracle's engine), as one
// JSON line, for bench/tokenizer/run.sh.
// usage: node bench-hf.js TOKENIZER.json CORPUS.txt [LOADS] [ENCODES]
"use strict";
const fs = require("fs");
const { Tokenizer } = require("tokenizers");

const [tokPath, corpusPath, loadsArg, encodesArg] = process.argv.slice(2);
const loads = Number(loadsArg || 5), encodes = Number(encodesArg || 5);
const median = (v) => v.slice().sort((a, b) => a - b)[Math.floor(v.length / 2)];
const secs = (t0) => Number(process.hrtime.bigint() - t0) / 1e9;

(async () => {
  const lt = [], et = [];
  let hf, n = 0;
  for (let i = 0; i < loads; i++) {
    const t0 = process.hrtime.bigint();
    hf = Tokenizer.fromFile(tokPath);
    lt.push(secs(t0));
  }
  const text = fs.readFileSync(corpusPath, "utf8");
  for (let i = 0; i < encodes; i++) {
    const t0 = process.hrtime.bigint();
    const e = await hf.encode(text, null, { addSpecialTokens: false });
    et.push(secs(t0));
    n = e.getIds().length;
  }
  const bytes = Buffer.byteLength(text);
  console.log(JSON.stringify({ engine: "hf-tokenizers-0.23.2", load_s: median(lt),
    encode_s: median(et), bytes, tokens: n, mb_per_s: bytes / 1e6 / median(et) }));
})();
