/* test_chat.c - chat templates: family detection on the real template texts, the
 * rendering of each family (expected strings derived by reading the official
 * templates, and checked against jinja2 by tests/test_chat_ref.py), the documented
 * deviations, buffer handling and error messages. */
#include <stdlib.h>
#include <string.h>

#include "ps.h"
#include "ps_test.h"
#include "tokenize/chat.h"

/* The templates, as in tests/test_chat_ref.py (tokenizer_config.json chat_template strings). */
enum {
    T_SMOLLM2,
    T_OPENHERMES,
    T_QWEN25,
    T_LLAMA2,
    T_MISTRAL01,
    T_MISTRAL02,
    T_MISTRAL02U,
    T_MISTRAL03,
    T_LLAMA3,
    T_LLAMA32,
    T_GEMMA2,
    T_GEMMA3,
    T_PHI3,
    T_PHI35,
    T_PHI3_OLD,
    T_ZEPHYR,
    T_COUNT
};
static const struct {
    const char *name;
    ps_chat_family family;
    const char *text;
} templates[T_COUNT] = {
    [T_SMOLLM2] =
        {"SmolLM2-135M-Instruct", PS_CHAT_CHATML,
         "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
         "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' "
         "+ message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt "
         "%}{{ '<|im_start|>assistant\n' }}{% endif %}"},
    [T_OPENHERMES] =
        {"OpenHermes-2.5-Mistral-7B", PS_CHAT_CHATML,
         "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' "
         "+ '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"},
    [T_QWEN25] =
        {"Qwen2.5-7B-Instruct", PS_CHAT_CHATML,
         "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- if messages[0]['role'] == 'system' %}\n "
         "       {{- messages[0]['content'] }}\n    {%- else %}\n        {{- 'You are Qwen, created by Alibaba "
         "Cloud. You are a helpful assistant.' }}\n    {%- endif %}\n    {{- \"\\n\\n# Tools\\n\\nYou may call "
         "one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within "
         "<tools></tools> XML tags:\\n<tools>\" }}\n    {%- for tool in tools %}\n        {{- \"\\n\" }}\n     "
         "   {{- tool | tojson }}\n    {%- endfor %}\n    {{- \"\\n</tools>\\n\\nFor each function call, return "
         "a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": "
         "<function-name>, \\\"arguments\\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n{%- else %}"
         "\n    {%- if messages[0]['role'] == 'system' %}\n        {{- '<|im_start|>system\\n' + messages[0]['content'] "
         "+ '<|im_end|>\\n' }}\n    {%- else %}\n        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba "
         "Cloud. You are a helpful assistant.<|im_end|>\\n' }}\n    {%- endif %}\n{%- endif %}\n{%- for message "
         "in messages %}\n    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) "
         "or (message.role == \"assistant\" and not message.tool_calls) %}\n        {{- '<|im_start|>' + message.role "
         "+ '\\n' + message.content + '<|im_end|>' + '\\n' }}\n    {%- elif message.role == \"assistant\" %}\n "
         "       {{- '<|im_start|>' + message.role }}\n        {%- if message.content %}\n            {{- '\\n' "
         "+ message.content }}\n        {%- endif %}\n        {%- for tool_call in message.tool_calls %}\n     "
         "       {%- if tool_call.function is defined %}\n                {%- set tool_call = tool_call.function "
         "%}\n            {%- endif %}\n            {{- '\\n<tool_call>\\n{\"name\": \"' }}\n            {{- tool_call.name "
         "}}\n            {{- '\", \"arguments\": ' }}\n            {{- tool_call.arguments | tojson }}\n      "
         "      {{- '}\\n</tool_call>' }}\n        {%- endfor %}\n        {{- '<|im_end|>\\n' }}\n    {%- elif "
         "message.role == \"tool\" %}\n        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "
         "\"tool\") %}\n            {{- '<|im_start|>user' }}\n        {%- endif %}\n        {{- '\\n<tool_response>\\n' "
         "}}\n        {{- message.content }}\n        {{- '\\n</tool_response>' }}\n        {%- if loop.last or "
         "(messages[loop.index0 + 1].role != \"tool\") %}\n            {{- '<|im_end|>\\n' }}\n        {%- endif "
         "%}\n    {%- endif %}\n{%- endfor %}\n{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' "
         "}}\n{%- endif %}\n"},
    [T_LLAMA2] =
        {"Llama-2-7b-chat", PS_CHAT_LLAMA2,
         "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = "
         "messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}"
         "{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == "
         "0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif "
         "%}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message "
         "+ '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif "
         "%}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif "
         "message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %"
         "}"},
    [T_MISTRAL01] =
        {"Mistral-7B-Instruct-v0.1", PS_CHAT_MISTRAL,
         "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == "
         "0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif "
         "%}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] "
         "== 'assistant' %}{{ message['content'] + eos_token + ' ' }}{% else %}{{ raise_exception('Only user and "
         "assistant roles are supported!') }}{% endif %}{% endfor %}"},
    [T_MISTRAL02] =
        {"Mistral-7B-Instruct-v0.2 (first)", PS_CHAT_MISTRAL,
         "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == "
         "0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif "
         "%}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] "
         "== 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant "
         "roles are supported!') }}{% endif %}{% endfor %}"},
    [T_MISTRAL02U] =
        {"Mistral-7B-Instruct-v0.2 (updated)", PS_CHAT_MISTRAL,
         "{%- if messages[0]['role'] == 'system' %}\n    {%- set system_message = messages[0]['content'] %}\n  "
         "  {%- set loop_messages = messages[1:] %}\n{%- else %}\n    {%- set loop_messages = messages %}\n{%- "
         "endif %}\n\n{{- bos_token }}\n{%- for message in loop_messages %}\n    {%- if (message['role'] == 'user') "
         "!= (loop.index0 % 2 == 0) %}\n        {{- raise_exception('After the optional system message, conversation "
         "roles must alternate user/assistant/user/assistant/...') }}\n    {%- endif %}\n    {%- if message['role'] "
         "== 'user' %}\n        {%- if loop.first and system_message is defined %}\n            {{- ' [INST] ' "
         "+ system_message + '\\n\\n' + message['content'] + ' [/INST]' }}\n        {%- else %}\n            {{- "
         "' [INST] ' + message['content'] + ' [/INST]' }}\n        {%- endif %}\n    {%- elif message['role'] == "
         "'assistant' %}\n        {{- ' ' + message['content'] + eos_token}}\n    {%- else %}\n        {{- raise_exception('Only "
         "user and assistant roles are supported, with the exception of an initial optional system message!') }"
         "}\n    {%- endif %}\n{%- endfor %}\n"},
    [T_MISTRAL03] =
        {"Mistral-7B-Instruct-v0.3", PS_CHAT_MISTRAL,
         "{%- if messages[0][\"role\"] == \"system\" %}\n    {%- set system_message = messages[0][\"content\"] "
         "%}\n    {%- set loop_messages = messages[1:] %}\n{%- else %}\n    {%- set loop_messages = messages %}"
         "\n{%- endif %}\n{%- if not tools is defined %}\n    {%- set tools = none %}\n{%- endif %}\n{%- set user_messages "
         "= loop_messages | selectattr(\"role\", \"equalto\", \"user\") | list %}\n\n{#- This block checks for "
         "alternating user/assistant messages, skipping tool calling messages #}\n{%- set ns = namespace() %}\n"
         "{%- set ns.index = 0 %}\n{%- for message in loop_messages %}\n    {%- if not (message.role == \"tool\" "
         "or message.role == \"tool_results\" or (message.tool_calls is defined and message.tool_calls is not none)) "
         "%}\n        {%- if (message[\"role\"] == \"user\") != (ns.index % 2 == 0) %}\n            {{- raise_exception(\"After "
         "the optional system message, conversation roles must alternate user/assistant/user/assistant/...\") }"
         "}\n        {%- endif %}\n        {%- set ns.index = ns.index + 1 %}\n    {%- endif %}\n{%- endfor %}\n"
         "\n{{- bos_token }}\n{%- for message in loop_messages %}\n    {%- if message[\"role\"] == \"user\" %}\n"
         "        {%- if tools is not none and (message == user_messages[-1]) %}\n            {{- \"[AVAILABLE_TOOLS] "
         "[\" }}\n            {%- for tool in tools %}\n                {%- set tool = tool.function %}\n      "
         "          {{- '{\"type\": \"function\", \"function\": {' }}\n                {%- for key, val in tool.items() "
         "if key != \"return\" %}\n                    {%- if val is string %}\n                        {{- '\"' "
         "+ key + '\": \"' + val + '\"' }}\n                    {%- else %}\n                        {{- '\"' + "
         "key + '\": ' + val|tojson }}\n                    {%- endif %}\n                    {%- if not loop.last "
         "%}\n                        {{- \", \" }}\n                    {%- endif %}\n                {%- endfor "
         "%}\n                {{- \"}}\" }}\n                {%- if not loop.last %}\n                    {{- \", "
         "\" }}\n                {%- else %}\n                    {{- \"]\" }}\n                {%- endif %}\n "
         "           {%- endfor %}\n            {{- \"[/AVAILABLE_TOOLS]\" }}\n            {%- endif %}\n      "
         "  {%- if loop.last and system_message is defined %}\n            {{- \"[INST] \" + system_message + \"\\n\\n\" "
         "+ message[\"content\"] + \"[/INST]\" }}\n        {%- else %}\n            {{- \"[INST] \" + message[\"content\"] "
         "+ \"[/INST]\" }}\n        {%- endif %}\n    {%- elif message.tool_calls is defined and message.tool_calls "
         "is not none %}\n        {{- \"[TOOL_CALLS] [\" }}\n        {%- for tool_call in message.tool_calls %}"
         "\n            {%- set out = tool_call.function|tojson %}\n            {{- out[:-1] }}\n            {%"
         "- if not tool_call.id is defined or tool_call.id|length != 9 %}\n                {{- raise_exception(\"Tool "
         "call IDs should be alphanumeric strings with length 9!\") }}\n            {%- endif %}\n            {{- "
         "', \"id\": \"' + tool_call.id + '\"}' }}\n            {%- if not loop.last %}\n                {{- \", "
         "\" }}\n            {%- else %}\n                {{- \"]\" + eos_token }}\n            {%- endif %}\n "
         "       {%- endfor %}\n    {%- elif message[\"role\"] == \"assistant\" %}\n        {{- \" \" + message[\"content\"]|trim "
         "+ eos_token}}\n    {%- elif message[\"role\"] == \"tool_results\" or message[\"role\"] == \"tool\" %}"
         "\n        {%- if message.content is defined and message.content.content is defined %}\n            {%"
         "- set content = message.content.content %}\n        {%- else %}\n            {%- set content = message.content "
         "%}\n        {%- endif %}\n        {{- '[TOOL_RESULTS] {\"content\": ' + content|string + \", \" }}\n "
         "       {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}\n           "
         " {{- raise_exception(\"Tool call IDs should be alphanumeric strings with length 9!\") }}\n        {%- "
         "endif %}\n        {{- '\"call_id\": \"' + message.tool_call_id + '\"}[/TOOL_RESULTS]' }}\n    {%- else "
         "%}\n        {{- raise_exception(\"Only user and assistant roles are supported, with the exception of "
         "an initial optional system message!\") }}\n    {%- endif %}\n{%- endfor %}\n"},
    [T_LLAMA3] =
        {"Meta-Llama-3-8B-Instruct", PS_CHAT_LLAMA3,
         "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' "
         "+ message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 "
         "== 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt "
         "%}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"},
    [T_LLAMA32] =
        {"Llama-3.2-3B-Instruct", PS_CHAT_LLAMA3,
         "{{- bos_token }}\n{%- if custom_tools is defined %}\n    {%- set tools = custom_tools %}\n{%- endif %"
         "}\n{%- if not tools_in_user_message is defined %}\n    {%- set tools_in_user_message = true %}\n{%- endif "
         "%}\n{%- if not date_string is defined %}\n    {%- if strftime_now is defined %}\n        {%- set date_string "
         "= strftime_now(\"%d %b %Y\") %}\n    {%- else %}\n        {%- set date_string = \"26 Jul 2024\" %}\n "
         "   {%- endif %}\n{%- endif %}\n{%- if not tools is defined %}\n    {%- set tools = none %}\n{%- endif "
         "%}\n\n{#- This block extracts the system message, so we can slot it into the right place. #}\n{%- if "
         "messages[0]['role'] == 'system' %}\n    {%- set system_message = messages[0]['content']|trim %}\n    "
         "{%- set messages = messages[1:] %}\n{%- else %}\n    {%- set system_message = \"\" %}\n{%- endif %}\n"
         "\n{#- System message #}\n{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}\n{%- if tools is "
         "not none %}\n    {{- \"Environment: ipython\\n\" }}\n{%- endif %}\n{{- \"Cutting Knowledge Date: December "
         "2023\\n\" }}\n{{- \"Today Date: \" + date_string + \"\\n\\n\" }}\n{%- if tools is not none and not tools_in_user_message "
         "%}\n    {{- \"You have access to the following functions. To call a function, please respond with JSON "
         "for a function call.\" }}\n    {{- 'Respond in the format {\"name\": function name, \"parameters\": dictionary "
         "of argument name and its value}.' }}\n    {{- \"Do not use variables.\\n\\n\" }}\n    {%- for t in tools "
         "%}\n        {{- t | tojson(indent=4) }}\n        {{- \"\\n\\n\" }}\n    {%- endfor %}\n{%- endif %}\n"
         "{{- system_message }}\n{{- \"<|eot_id|>\" }}\n\n{#- Custom tools are passed in a user message with some "
         "extra guidance #}\n{%- if tools_in_user_message and not tools is none %}\n    {#- Extract the first user "
         "message so we can plug it in here #}\n    {%- if messages | length != 0 %}\n        {%- set first_user_message "
         "= messages[0]['content']|trim %}\n        {%- set messages = messages[1:] %}\n    {%- else %}\n      "
         "  {{- raise_exception(\"Cannot put tools in the first user message when there's no first user message!\") "
         "}}\n{%- endif %}\n    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}\n    {{- \"Given the following "
         "functions, please respond with a JSON for a function call \" }}\n    {{- \"with its proper arguments "
         "that best answers the given prompt.\\n\\n\" }}\n    {{- 'Respond in the format {\"name\": function name, "
         "\"parameters\": dictionary of argument name and its value}.' }}\n    {{- \"Do not use variables.\\n\\n\" "
         "}}\n    {%- for t in tools %}\n        {{- t | tojson(indent=4) }}\n        {{- \"\\n\\n\" }}\n    {%"
         "- endfor %}\n    {{- first_user_message + \"<|eot_id|>\"}}\n{%- endif %}\n\n{%- for message in messages "
         "%}\n    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %"
         "}\n        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] "
         "| trim + '<|eot_id|>' }}\n    {%- elif 'tool_calls' in message %}\n        {%- if not message.tool_calls|length "
         "== 1 %}\n            {{- raise_exception(\"This model only supports single tool-calls at once!\") }}\n"
         "        {%- endif %}\n        {%- set tool_call = message.tool_calls[0].function %}\n        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' "
         "-}}\n        {{- '{\"name\": \"' + tool_call.name + '\", ' }}\n        {{- '\"parameters\": ' }}\n   "
         "     {{- tool_call.arguments | tojson }}\n        {{- \"}\" }}\n        {{- \"<|eot_id|>\" }}\n    {%"
         "- elif message.role == \"tool\" or message.role == \"ipython\" %}\n        {{- \"<|start_header_id|>ipython<|end_header_id|>\\n\\n\" "
         "}}\n        {%- if message.content is mapping or message.content is iterable %}\n            {{- message.content "
         "| tojson }}\n        {%- else %}\n            {{- message.content }}\n        {%- endif %}\n        {{- "
         "\"<|eot_id|>\" }}\n    {%- endif %}\n{%- endfor %}\n{%- if add_generation_prompt %}\n    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' "
         "}}\n{%- endif %}\n"},
    [T_GEMMA2] =
        {"gemma-2-2b-it", PS_CHAT_GEMMA,
         "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') "
         "}}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) "
         "%}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif "
         "%}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] "
         "%}{% endif %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}{%"
         " endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}"},
    [T_GEMMA3] =
        {"gemma-3-1b-it", PS_CHAT_GEMMA,
         "{{ bos_token }}\n{%- if messages[0]['role'] == 'system' -%}\n    {%- if messages[0]['content'] is string "
         "-%}\n        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}\n    {%- else -%}\n   "
         "     {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}\n    {%- endif -%}\n"
         "    {%- set loop_messages = messages[1:] -%}\n{%- else -%}\n    {%- set first_user_prefix = \"\" -%}\n"
         "    {%- set loop_messages = messages -%}\n{%- endif -%}\n{%- for message in loop_messages -%}\n    {%"
         "- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n        {{ raise_exception(\"Conversation "
         "roles must alternate user/assistant/user/assistant/...\") }}\n    {%- endif -%}\n    {%- if (message['role'] "
         "== 'assistant') -%}\n        {%- set role = \"model\" -%}\n    {%- else -%}\n        {%- set role = message['role'] "
         "-%}\n    {%- endif -%}\n    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else "
         "\"\") }}\n    {%- if message['content'] is string -%}\n        {{ message['content'] | trim }}\n    {%"
         "- elif message['content'] is iterable -%}\n        {%- for item in message['content'] -%}\n          "
         "  {%- if item['type'] == 'image' -%}\n                {{ '<start_of_image>' }}\n            {%- elif "
         "item['type'] == 'text' -%}\n                {{ item['text'] | trim }}\n            {%- endif -%}\n   "
         "     {%- endfor -%}\n    {%- else -%}\n        {{ raise_exception(\"Invalid content type\") }}\n    {%"
         "- endif -%}\n    {{ '<end_of_turn>\\n' }}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n    {{'<start_of_turn>model\\n'}"
         "}\n{%- endif -%}\n"},
    [T_PHI3] =
        {"Phi-3-mini-4k-instruct", PS_CHAT_PHI3,
         "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + message['content'] "
         "+ '<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}"
         "}{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% "
         "endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% "
         "endif %}"},
    [T_PHI35] =
        {"Phi-3.5-mini-instruct", PS_CHAT_PHI3,
         "{% for message in messages %}{% if message['role'] == 'system' and message['content'] %}{{'<|system|>\n"
         "' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] "
         "+ '<|end|>\n'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n"
         "'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token "
         "}}{% endif %}"},
    [T_PHI3_OLD] =
        {"Phi-3-mini-4k-instruct (first)", PS_CHAT_PHI3,
         "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') %}{{'<|user|>' + '\\n' "
         "+ message['content'] + '<|end|>' + '\\n' + '<|assistant|>' + '\\n'}}{% elif (message['role'] == 'assistant') "
         "%}{{message['content'] + '<|end|>' + '\\n'}}{% endif %}{% endfor %}"},
    [T_ZEPHYR] =
        {"zephyr-7b-beta", PS_CHAT_ZEPHYR,
         "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + message['content'] "
         "+ eos_token }}\n{% elif message['role'] == 'system' %}\n{{ '<|system|>\n' + message['content'] + eos_token "
         "}}\n{% elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\n'  + message['content'] + eos_token "
         "}}\n{% endif %}\n{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{%"
         " endfor %}"},
};

#define CHECK_STR(got, want)                                                                                           \
    do {                                                                                                               \
        const char *g_ = (got), *w_ = (want);                                                                          \
        PS_CHECK(g_ &&strcmp(g_, w_) == 0);                                                                            \
        if (!g_ || strcmp(g_, w_)) fprintf(stderr, "  got  \"%s\"\n  want \"%s\"\n", g_ ? g_ : "(null)", w_);          \
    } while (0)

static const ps_chat_msg conv4[4] = {
    {"system", "You are a helpful assistant."},
    {"user", "Hello!"},
    {"assistant", "Hi there. How can I help?"},
    {"user", "What is 2+2?"},
};
static const ps_chat_msg conv3[3] = {{"user", "Hello!"}, {"assistant", "Hi there."}, {"user", "What is 2+2?"}};

/* Renders msgs with c into a malloc'd string (NULL on failure; the caller frees). */
static char *render(const ps_chat *c, const ps_chat_msg *msgs, size_t n, bool gen) {
    char *out = NULL, err[256] = "";
    size_t len = 0;
    ps_status st = ps_chat_apply_alloc(c, msgs, n, gen, &out, &len, err, sizeof err);
    if (st) fprintf(stderr, "  ps_chat_apply_alloc: %s\n", err);
    PS_CHECK_OK(st);
    if (out) PS_CHECK_EQ_INT(len, strlen(out));
    return out;
}

/* A renderer from a template text (name NULL) or a family name (text NULL). */
static ps_chat *make(const char *text, const char *name, const char *bos, const char *eos) {
    ps_chat *c = NULL;
    char err[256] = "";
    ps_status st = ps_chat_create(text, name, bos, eos, &c, err, sizeof err);
    if (st) fprintf(stderr, "  ps_chat_create: %s\n", err);
    PS_CHECK_OK(st);
    return c;
}

/* The rendering of msgs by template t (or by family name when t < 0) equals want. */
static void check_render(int t, const char *name, const ps_chat_msg *msgs, size_t n, bool gen, const char *want) {
    ps_chat *c = make(t >= 0 ? templates[t].text : NULL, name, NULL, NULL);
    if (!c) return;
    char *got = render(c, msgs, n, gen);
    if (!got || strcmp(got, want)) fprintf(stderr, "  for %s:\n", t >= 0 ? templates[t].name : name);
    CHECK_STR(got, want);
    free(got);
    ps_chat_free(c);
}

// ---- detection ----------------------------------------------------------------------

static void test_detect_real_templates(void) {
    for (int t = 0; t < T_COUNT; t++) {
        ps_chat_family f = PS_CHAT_FAMILY_COUNT;
        char err[256] = "";
        PS_CHECK_OK(ps_chat_detect(templates[t].text, &f, err, sizeof err));
        if (f != templates[t].family)
            fprintf(stderr, "  %s detected as %s\n", templates[t].name, ps_chat_family_name(f));
        PS_CHECK_EQ_INT(f, templates[t].family);
    }
}

static void expect_unrecognised(const char *tmpl, const char *quoted) {
    ps_chat_family f;
    char err[512] = "";
    PS_CHECK_EQ_INT(ps_chat_detect(tmpl, &f, err, sizeof err), PS_ERR_UNSUPPORTED);
    PS_CHECK(strstr(err, quoted) != NULL);
    PS_CHECK(strstr(err, "pass --chat-template NAME, one of: chatml, llama2, mistral, llama3, gemma, phi3, zephyr"));
    if (!strstr(err, quoted)) fprintf(stderr, "  message: %s\n", err);
}

static void test_detect_errors(void) {
    expect_unrecognised("{{ messages }}", "unrecognised chat template (starts with '{{ messages }}')");
    /* long templates are cut at 40 bytes, newlines shown as spaces */
    expect_unrecognised("{% for m in messages %}\n{{ m.content }}{% endfor %}{{ 'xyz' }}",
                        "(starts with '{% for m in messages %} {{ m.content }}{...')");
    /* near misses: Phi-4 (ChatML-like with <|im_sep|>), Tulu (no eos after the user turn),
     * Phi-4-mini (no newline after the role tag), Mistral v7 ([SYSTEM_PROMPT]) */
    expect_unrecognised(
        "{% for m in messages %}{{'<|im_start|>' + m['role'] + '<|im_sep|>' + m['content'] + '<|im_end|>'}}{% endfor %}",
        "unrecognised");
    expect_unrecognised(
        "{% for message in messages %}{{ '<|user|>\\n' + message['content'] + '\\n' }}{{ '<|assistant|>\\n' }}{% endfor %}",
        "unrecognised");
    expect_unrecognised(
        "{% for message in messages %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
        "{% endfor %}{{ '<|assistant|>' }}",
        "unrecognised");
    expect_unrecognised("{{ bos_token }}[SYSTEM_PROMPT]{{ s }}[/SYSTEM_PROMPT][INST]{{ u }}[/INST]", "unrecognised");

    ps_chat_family f;
    char err[512] = "";
    PS_CHECK_EQ_INT(ps_chat_detect(NULL, &f, err, sizeof err), PS_ERR_NOT_FOUND);
    PS_CHECK(strstr(err, "no chat template") && strstr(err, "--chat-template NAME"));
    PS_CHECK_EQ_INT(ps_chat_detect("", &f, NULL, 0), PS_ERR_NOT_FOUND);
    ps_chat *c = (ps_chat *)&f;
    PS_CHECK_EQ_INT(ps_chat_create(NULL, NULL, NULL, NULL, &c, err, sizeof err), PS_ERR_NOT_FOUND);
    PS_CHECK(c == NULL);
}

static void test_names(void) {
    for (int f = 0; f < PS_CHAT_FAMILY_COUNT; f++) {
        ps_chat_family g = PS_CHAT_FAMILY_COUNT;
        PS_CHECK_OK(ps_chat_family_from_name(ps_chat_family_name((ps_chat_family)f), &g, NULL, 0));
        PS_CHECK_EQ_INT(g, f);
    }
    CHECK_STR(ps_chat_family_name(PS_CHAT_LLAMA3), "llama3");
    CHECK_STR(ps_chat_family_name(PS_CHAT_FAMILY_COUNT), "unknown");
    ps_chat_family g;
    char err[256] = "";
    PS_CHECK_EQ_INT(ps_chat_family_from_name("vicuna", &g, err, sizeof err), PS_ERR_ARG);
    CHECK_STR(err,
              "unknown chat template name 'vicuna'; use one of: chatml, llama2, mistral, llama3, gemma, phi3, zephyr");
    ps_chat *c = NULL;
    PS_CHECK_EQ_INT(ps_chat_create(templates[T_LLAMA3].text, "Llama3", NULL, NULL, &c, err, sizeof err), PS_ERR_ARG);
    /* a name overrides the template */
    c = make(templates[T_LLAMA3].text, "zephyr", NULL, NULL);
    if (c) PS_CHECK_EQ_INT(ps_chat_get_family(c), PS_CHAT_ZEPHYR);
    ps_chat_free(c);
    ps_chat_free(NULL);
}

// ---- rendering of system + user + assistant + user, per family -----------------------

static void test_render_families(void) {
    const char *chatml =
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHello!<|im_end|>\n"
        "<|im_start|>assistant\nHi there. How can I help?<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n";
    check_render(T_SMOLLM2, NULL, conv4, 4, true, chatml);
    check_render(T_QWEN25, NULL, conv4, 4, true, chatml);
    check_render(-1, "chatml", conv4, 4, true, chatml);
    const char *llama2 =
        "<s>[INST] <<SYS>>\nYou are a helpful assistant.\n<</SYS>>\n\nHello! [/INST] Hi there. How can I help? </s>"
        "<s>[INST] What is 2+2? [/INST]";
    check_render(T_LLAMA2, NULL, conv4, 4, true, llama2);
    check_render(-1, "llama2", conv4, 4, true, llama2);
    /* Mistral v0.3 puts the system text before the last user message */
    const char *mistral =
        "<s>[INST] Hello![/INST] Hi there. How can I help?</s>[INST] You are a helpful assistant.\n\nWhat is 2+2?[/INST]";
    check_render(T_MISTRAL03, NULL, conv4, 4, true, mistral);
    check_render(-1, "mistral", conv4, 4, true, mistral);
    check_render(
        T_MISTRAL02U, NULL, conv4, 4, true,
        "<s> [INST] You are a helpful assistant.\n\nHello! [/INST] Hi there. How can I help?</s> [INST] What is 2+2? [/INST]");
    const char *llama3 =
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
        "Hi there. How can I help?<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n";
    check_render(T_LLAMA3, NULL, conv4, 4, true, llama3);
    check_render(-1, "llama3", conv4, 4, true, llama3);
    check_render(
        T_LLAMA32, NULL, conv4, 4, true,
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
        "Today Date: 26 Jul 2024\n\nYou are a helpful assistant.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"
        "Hello!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHi there. How can I help?<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
    const char *gemma =
        "<bos><start_of_turn>user\nYou are a helpful assistant.\n\nHello!<end_of_turn>\n<start_of_turn>model\n"
        "Hi there. How can I help?<end_of_turn>\n<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n";
    check_render(T_GEMMA3, NULL, conv4, 4, true, gemma);
    check_render(T_GEMMA2, NULL, conv4, 4, true, gemma); /* documented fold: Gemma 2's template raises */
    check_render(-1, "gemma", conv4, 4, true, gemma);
    const char *phi3 = "<|system|>\nYou are a helpful assistant.<|end|>\n<|user|>\nHello!<|end|>\n<|assistant|>\n"
                       "Hi there. How can I help?<|end|>\n<|user|>\nWhat is 2+2?<|end|>\n<|assistant|>\n";
    check_render(T_PHI3, NULL, conv4, 4, true, phi3);
    check_render(T_PHI35, NULL, conv4, 4, true, phi3);
    check_render(-1, "phi3", conv4, 4, true, phi3);
    const char *zephyr = "<|system|>\nYou are a helpful assistant.</s>\n<|user|>\nHello!</s>\n<|assistant|>\n"
                         "Hi there. How can I help?</s>\n<|user|>\nWhat is 2+2?</s>\n<|assistant|>\n";
    check_render(T_ZEPHYR, NULL, conv4, 4, true, zephyr);
    check_render(-1, "zephyr", conv4, 4, true, zephyr);
}

/* Older variants read from their templates. */
static void test_render_variants(void) {
    check_render(T_MISTRAL01, NULL, conv3, 3, true,
                 "<s>[INST] Hello! [/INST]Hi there.</s> [INST] What is 2+2? [/INST]");
    check_render(T_MISTRAL02, NULL, conv3, 3, true, "<s>[INST] Hello! [/INST]Hi there.</s>[INST] What is 2+2? [/INST]");
    /* documented fold of a system message the v0.1 template would reject */
    check_render(
        T_MISTRAL01, NULL, conv4, 4, false,
        "<s>[INST] You are a helpful assistant.\n\nHello! [/INST]Hi there. How can I help?</s> [INST] What is 2+2? [/INST]");
    /* Phi-3's first template: the user turn opens the assistant's, system dropped */
    check_render(
        T_PHI3_OLD, NULL, conv4, 4, true,
        "<s><|user|>\nHello!<|end|>\n<|assistant|>\nHi there. How can I help?<|end|>\n<|user|>\nWhat is 2+2?<|end|>\n<|assistant|>\n");
    /* Phi-3: eos_token when there is no generation prompt; Phi-3.5 skips an empty system message */
    const ps_chat_msg m[2] = {{"system", ""}, {"user", "hi"}};
    check_render(T_PHI3, NULL, m, 2, false, "<|system|>\n<|end|>\n<|user|>\nhi<|end|>\n<|endoftext|>");
    check_render(T_PHI35, NULL, m, 2, false, "<|user|>\nhi<|end|>\n<|endoftext|>");
    /* Llama 3.2 without a system message still writes its system header */
    check_render(
        T_LLAMA32, NULL, conv3 + 2, 1, false,
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
        "Today Date: 26 Jul 2024\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>");
}

/* SmolLM2's and Qwen 2.5's templates insert their own system message. */
static void test_default_system(void) {
    const ps_chat_msg u[1] = {{"user", "Hi"}};
    ps_chat *c = make(templates[T_SMOLLM2].text, NULL, NULL, NULL);
    if (c) CHECK_STR(ps_chat_default_system(c), "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
    ps_chat_free(c);
    check_render(T_SMOLLM2, NULL, u, 1, true,
                 "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
                 "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    check_render(T_QWEN25, NULL, u, 1, false,
                 "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
                 "<|im_start|>user\nHi<|im_end|>\n");
    check_render(T_OPENHERMES, NULL, u, 1, true, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    check_render(-1, "chatml", u, 1, true, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    c = make(templates[T_OPENHERMES].text, NULL, NULL, NULL);
    if (c) PS_CHECK(ps_chat_default_system(c) == NULL);
    ps_chat_free(c);
}

/* Stripping follows Python's str.strip, Unicode spaces included. */
static void test_strip(void) {
    const ps_chat_msg m[2] = {{"user", "\xe3\x80\x80 hi\xc2\xa0x \xc2\xa0\t\n"},
                              {"assistant", "\xe2\x80\x8a ok \xc2\x85"}};
    check_render(-1, "llama3", m, 2, false,
                 "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi\xc2\xa0x<|eot_id|>"
                 "<|start_header_id|>assistant<|end_header_id|>\n\nok<|eot_id|>");
    /* Llama 2 strips the whole first turn: an empty user message leaves "<</SYS>>" last */
    const ps_chat_msg s[2] = {{"system", "S"}, {"user", "  "}};
    check_render(-1, "llama2", s, 2, true, "<s>[INST] <<SYS>>\nS\n<</SYS>> [/INST]");
}

/* The model's own BOS / EOS text is used; ps_chat_writes_bos says whether it appears. */
static void test_bos_eos(void) {
    ps_chat *c = make(templates[T_LLAMA2].text, NULL, "<BOS>", "<EOS>");
    if (!c) return;
    PS_CHECK(ps_chat_writes_bos(c));
    char *got = render(c, conv3, 3, true);
    CHECK_STR(got, "<BOS>[INST] Hello! [/INST] Hi there. <EOS><BOS>[INST] What is 2+2? [/INST]");
    free(got);
    ps_chat_free(c);
    c = make(templates[T_SMOLLM2].text, NULL, "<|im_start|>", "<|im_end|>");
    if (c) PS_CHECK(!ps_chat_writes_bos(c));
    ps_chat_free(c);
    c = make(templates[T_LLAMA3].text, NULL, NULL, NULL);
    if (c) PS_CHECK(ps_chat_writes_bos(c));
    ps_chat_free(c);
}

// ---- buffers and errors -------------------------------------------------------------

static void test_buffers(void) {
    ps_chat *c = make(NULL, "zephyr", NULL, NULL);
    if (!c) return;
    const ps_chat_msg u[1] = {{"user", "Hi"}};
    const char *want = "<|user|>\nHi</s>\n<|assistant|>\n";
    size_t n = strlen(want), len = 0;
    char buf[64], err[256] = "";
    PS_CHECK_OK(ps_chat_apply(c, u, 1, true, NULL, 0, &len, NULL, 0)); /* measure only */
    PS_CHECK_EQ_INT(len, n);
    PS_CHECK_OK(ps_chat_apply(c, u, 1, true, buf, n + 1, &len, NULL, 0)); /* exact fit */
    CHECK_STR(buf, want);
    memset(buf, 'x', sizeof buf);
    PS_CHECK_EQ_INT(ps_chat_apply(c, u, 1, true, buf, 8, &len, err, sizeof err), PS_ERR_RANGE);
    PS_CHECK_EQ_INT(len, n);
    CHECK_STR(buf, "<|user|");
    char needs[64];
    snprintf(needs, sizeof needs, "needs %zu bytes and a NUL; the buffer has 8", n);
    PS_CHECK(strstr(err, needs) != NULL);
    PS_CHECK_EQ_INT(ps_chat_apply(c, u, 1, true, buf, n, &len, NULL, 0), PS_ERR_RANGE); /* no room for the NUL */
    ps_chat_free(c);
}

static void expect_bad(const char *family, const ps_chat_msg *m, size_t n, const char *needle) {
    ps_chat *c = make(NULL, family, NULL, NULL);
    if (!c) return;
    char buf[256] = "x", err[256] = "";
    size_t len = 99;
    PS_CHECK_EQ_INT(ps_chat_apply(c, m, n, true, buf, sizeof buf, &len, err, sizeof err), PS_ERR_ARG);
    PS_CHECK_EQ_INT(len, 0);
    PS_CHECK(buf[0] == '\0');
    if (!strstr(err, needle)) fprintf(stderr, "  message '%s' lacks '%s'\n", err, needle);
    PS_CHECK(strstr(err, needle) != NULL);
    char *out = (char *)1;
    PS_CHECK_EQ_INT(ps_chat_apply_alloc(c, m, n, true, &out, NULL, NULL, 0), PS_ERR_ARG);
    PS_CHECK(out == NULL);
    ps_chat_free(c);
}

static void test_errors(void) {
    const ps_chat_msg tool[2] = {{"user", "x"}, {"tool", "y"}};
    expect_bad("chatml", tool, 2, "message 1 has role 'tool'; supported: system, user, assistant");
    const ps_chat_msg nul[1] = {{"user", NULL}};
    expect_bad("llama3", nul, 1, "message 0 (user) has no content");
    expect_bad("phi3", conv4, 0, "at least one message");
    const ps_chat_msg uu[2] = {{"user", "a"}, {"user", "b"}};
    expect_bad("llama2", uu, 2, "message 1 is a user message where the llama2 template expects assistant");
    const ps_chat_msg mid[3] = {{"user", "a"}, {"system", "s"}, {"user", "b"}};
    expect_bad("gemma", mid, 3, "message 1 is a system message");
    const ps_chat_msg first_asst[2] = {{"system", "s"}, {"assistant", "a"}};
    expect_bad("mistral", first_asst, 2, "expects user");
    /* families without the rule render any order */
    ps_chat *c = make(NULL, "chatml", NULL, NULL);
    char *out = c ? render(c, mid, 3, false) : NULL;
    CHECK_STR(out, "<|im_start|>user\na<|im_end|>\n<|im_start|>system\ns<|im_end|>\n<|im_start|>user\nb<|im_end|>\n");
    free(out);
    ps_chat_free(c);
}

int main(void) {
    test_detect_real_templates();
    test_detect_errors();
    test_names();
    test_render_families();
    test_render_variants();
    test_default_system();
    test_strip();
    test_bos_eos();
    test_buffers();
    test_errors();
    return ps_test_done();
}
