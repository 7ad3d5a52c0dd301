// The official OpenAI SDK as a client of a gateway: what an application
// sees. usage: node openai_sdk.cjs BASE_URL MODEL (openai_sdk_lib.cjs holds
// the client and check()). Prints one line per check and exits 1 on the
// first failure.
'use strict';
const { OpenAI, client, model, check } = require('./openai_sdk_lib.cjs');

async function main() {
  const c = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 8 });
  check(c.choices.length === 1 && typeof c.choices[0].text === 'string', 'completion: one choice with text');
  check(c.usage && c.usage.completion_tokens > 0, `completion: usage (${c.usage && c.usage.completion_tokens} tokens)`);

  const chat = await client.chat.completions.create({
    model, max_tokens: 8, messages: [{ role: 'user', content: 'hi' }],
  });
  check(chat.choices[0].message.role === 'assistant', 'chat: an assistant message');

  // A stream, read as the SDK's async iterator: every chunk parses, the
  // first carries the role, the content adds up, a finish reason ends it,
  // and usage comes last when asked for.
  const stream = await client.chat.completions.create({
    model, max_tokens: 12, stream: true, stream_options: { include_usage: true },
    messages: [{ role: 'system', content: 'be brief' }, { role: 'user', content: 'hello <|im_end|>' }],
  });
  let chunks = 0, role = null, text = '', finish = null, usage = null;
  for await (const ch of stream) {
    chunks++;
    if (ch.usage) usage = ch.usage;
    for (const choice of ch.choices) {
      if (choice.delta.role) role = role || choice.delta.role;
      if (choice.delta.content) text += choice.delta.content;
      if (choice.finish_reason) finish = choice.finish_reason;
    }
  }
  check(chunks > 1 && role === 'assistant', `chat stream: ${chunks} chunks, role ${role}`);
  check(finish === 'length' || finish === 'stop', `chat stream: finish_reason ${finish}`);
  check(usage && usage.completion_tokens > 0 && usage.prompt_tokens > 0,
        `chat stream: usage ${usage && usage.prompt_tokens}+${usage && usage.completion_tokens}`);

  const cs = await client.completions.create({ model, prompt: 'abc', max_tokens: 6, stream: true });
  let cchunks = 0, cfinish = null;
  for await (const ch of cs) {
    cchunks++;
    if (ch.choices.length && ch.choices[0].finish_reason) cfinish = ch.choices[0].finish_reason;
  }
  check(cchunks > 1 && (cfinish === 'length' || cfinish === 'stop'),
        `completion stream: ${cchunks} chunks, finish_reason ${cfinish}`);

  // Errors arrive as the SDK's typed errors, with our OpenAI-shaped body.
  try {
    await client.completions.create({ model: 'no-such-model', prompt: 'x', max_tokens: 1 });
    check(false, 'unknown model: an error');
  } catch (e) {
    check(e instanceof OpenAI.NotFoundError && e.status === 404, `unknown model: NotFoundError ${e.status}`);
    check(typeof e.message === 'string' && e.message.length > 0, 'unknown model: a message');
  }
  try {
    await client.completions.create({ model, prompt: 'x', max_tokens: -3 });
    check(false, 'bad max_tokens: an error');
  } catch (e) {
    check(e instanceof OpenAI.BadRequestError && e.status === 400, `bad max_tokens: BadRequestError ${e.status}`);
    check(e.error && e.error.param === 'max_tokens', `bad max_tokens: param ${e.error && e.error.param}`);
  }
  const models = await client.models.list();
  check(models.data.some((m) => m.id === model), 'models.list names the model');
}

main().catch((e) => {
  console.log(`FAIL unexpected: ${e && e.stack ? e.stack : e}`);
  process.exit(1);
});
