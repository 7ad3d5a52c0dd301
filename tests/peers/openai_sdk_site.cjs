// The official OpenAI SDK as an application uses it, against a gateway in
// front of a full OpenAI-compatible site (tests/peers/recording_site.py):
// function calling, plain and streamed, embeddings and the Responses API,
// all routed through the gateway. usage: node openai_sdk_site.cjs BASE_URL
// MODEL (openai_sdk_lib.cjs holds the client and check()). Prints one line
// per check and exits 1 on the first failure.
'use strict';
const { client, model, check } = require('./openai_sdk_lib.cjs');

const tools = [{
  type: 'function',
  function: {
    name: 'get_weather', description: 'the weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  },
}];

async function main() {
  const chat = await client.chat.completions.create({
    model, tools, tool_choice: 'auto', messages: [{ role: 'user', content: 'weather in Paris?' }],
  });
  const call = chat.choices[0].message.tool_calls && chat.choices[0].message.tool_calls[0];
  check(chat.choices[0].finish_reason === 'tool_calls' && call && call.function.name === 'get_weather',
        `chat with tools: a tool call (${call && call.function.name})`);
  check(JSON.parse(call.function.arguments).i === 0, `chat with tools: arguments ${call.function.arguments}`);

  // Streamed: the SDK's own stream helper assembles the tool call deltas.
  const stream = client.chat.completions.stream({
    model, tools, n: 2, messages: [{ role: 'user', content: 'weather in Paris?' }],
  });
  const done = await stream.finalChatCompletion();
  check(done.choices.length === 2, `streamed tools: ${done.choices.length} choices`);
  const calls = done.choices.map((c) => c.message.tool_calls && c.message.tool_calls[0]);
  check(calls.every((c, i) => c && c.function.name === 'get_weather' &&
                    JSON.parse(c.function.arguments).i === i),
        'streamed tools: each choice assembled its own tool call');

  const emb = await client.embeddings.create({ model, input: ['one', 'two'], encoding_format: 'float' });
  check(emb.data.length === 2 && emb.data[1].embedding.length === 4 &&
        emb.data[1].embedding[0] === 1.5, `embeddings: ${emb.data.length} vectors`);

  const resp = await client.responses.create({ model, input: 'hello', instructions: 'be kind' });
  check(resp.output_text === 'the site answers', `responses: output_text "${resp.output_text}"`);

  const rs = await client.responses.create({ model, input: 'hello', stream: true });
  let text = '', completed = false;
  for await (const ev of rs) {
    if (ev.type === 'response.output_text.delta') text += ev.delta;
    if (ev.type === 'response.completed') completed = true;
  }
  check(completed && text === 'the site answers', `responses stream: "${text}"`);
}

main().catch((e) => {
  console.log(`FAIL ${e && e.message}`);
  process.exit(1);
});
