// What the OpenAI SDK checks share: the SDK (npm `openai`, 6.x, from
// IG_NPM_MODULES, which bench/lib/tokpeers.sh fills outside the repository),
// a client of the gateway at argv's BASE_URL with maxRetries 0 (a flaky
// answer is seen, not retried away), argv's MODEL, and check(), which prints
// one line per check and exits 1 on the first failure.
'use strict';
const path = require('path');
const OpenAI = require(path.join(process.env.IG_NPM_MODULES || '', 'openai')).default;

const [base, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL: base, apiKey: 'none', maxRetries: 0, timeout: 30000 });

function check(ok, what) {
  if (!ok) {
    console.log(`FAIL ${what}`);
    process.exit(1);
  }
  console.log(`ok ${what}`);
}

module.exports = { OpenAI, client, model, check };
