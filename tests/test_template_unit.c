/* test_template_unit.c - the Jinja engine without the golden folder.
 *
 * Table-driven: every template below is rendered with one fixed set of
 * variables (VARS_JSON) and compared byte for byte with the text Python
 * jinja2 3.1 renders under Hugging Face's settings; the expected strings
 * were produced by that reference, not by this engine.  Then run-time
 * errors (message text as Python's exception), syntax errors (with line
 * and column), hostile templates that must hit a limit instead of hanging
 * or crashing, the chat_template_render API, allocation failures at every
 * step, and concurrent renders of one parsed template. */
#include "test.h"
#include "base/err.h"
#include "base/mem.h"
#include "text/chat_template.h"
#include "jinja/jinja.h"

#include <jansson.h>
#include <pthread.h>

typedef struct { const char *src, *expect; } tcase;
typedef struct { const char *src, *message; } ecase;

/* ---- expected output from Python jinja2 -------------------------------- */

static const tcase LITERALS[] = {
    {"{{ 1 }}|{{ -3 }}|{{ 1.0 }}|{{ 2.50 }}|{{ 1e20 }}|{{ 1.5e-7 }}|{{ 0.1 + 0.2 }}|{{ 1e16 }}|{{ 1e15 }}|{{ 0.0001 }}",
     "1|-3|1.0|2.5|1e+20|1.5e-07|0.30000000000000004|1e+16|1000000000000000.0|0.0001"},
    {"{{ true }}|{{ True }}|{{ false }}|{{ none }}|{{ None }}|{{ undefined_name }}|",
     "True|True|False|None|None||"},
    {"{{ [1, 'a', none, true, 2.5] }}|{{ {'k': 'v', 'n': [1]} }}|{{ (1,) }}|{{ (1, 2) }}|{{ () }}|{{ [] }}|{{ {} }}",
     "[1, 'a', None, True, 2.5]|{'k': 'v', 'n': [1]}|(1,)|(1, 2)|()|[]|{}"},
    {"{{ \"it's\" }}|{{ ['it\\'s', \"say \\\"hi\\\"\", 'both \\' and \"'] }}",
     "it's|[\"it's\", 'say \"hi\"', 'both \\' and \"']"},
    {"{{ 'a\\tb\\\\c\\x41\\u00e9\\U0001F600\\101' }}|{{ ['\\n', '\\x01', '\303\251\360\237\230\200', '\\u00a0'] }}",
     "a\tb\\cA\303\251\360\237\230\200A|['\\n', '\\x01', '\303\251\360\237\230\200', '\\xa0']"},
    {"{{ 'ab' 'cd' }}|{{ 0x1F }}|{{ 0o17 }}|{{ 0b101 }}|{{ 1_000 }}|{{ 1_0.5 }}",
     "abcd|31|15|5|1000|10.5"},
    {"{{ n }}|{{ f }}|{{ s }}|{{ u }}|{{ lst }}|{{ d }}|{{ none }}|{{ nested }}",
     "5|2.5|  Hello World  |\303\234n\303\257c\303\266d\303\251 \360\237\230\200 \346\227\245\346\234\254\350\252\236|[3, 1, 2]|{'b': 2, 'a': 1, 'items': 7}|None|{'x': {'y': [1, {'z': 'deep'}]}}"},
    {"{{ 1, 2 }}|{{ (1, 'x') }}",
     "(1, 2)|(1, 'x')"},
};

static const tcase WHITESPACE[] = {
    {"  {% if true %}\n    kept\n  {% endif %}\nend",
     "    kept\nend"},
    {"{% for m in messages %}\n  {{ m.role }}\n{% endfor %}",
     "  system\n  user\n  assistant\n  tool\n"},
    {"{%- for m in messages -%}\n  {{- m.role -}}\n{%- endfor -%}\ntail",
     "systemuserassistanttooltail"},
    {"a\n  {%+ if true %}x{% endif %}\n  {# c #}\n  {%- if true %}  y{% endif +%}\nz",
     "a\n  x  y\nz"},
    {"{% raw %}\n  {{ x }}\n  {% endraw %}\nafter",
     "\n  {{ x }}\nafter"},
    {"  {{ 'var' }}\n\t{% if true %}tab{% endif %}\n",
     "  var\ntab"},
    {"text{% if true %}\n\n{% endif %}more",
     "text\nmore"},
    {"line1\n{# comment #}\nline2\n{#- c -#}\nline3",
     "line1\nline2line3"},
    {"{{ 'a' }}\n{{ 'b' -}}\n   {{ 'c' }}",
     "a\nbc"},
    {"trailing newline dropped\n",
     "trailing newline dropped"},
    {"two trailing newlines\n\n",
     "two trailing newlines\n"},
    {"win\r\nline\r\n{% if true %}\r\nx\r\n{% endif %}\r\n",
     "win\nline\nx\n"},
    {"{%   for   x   in   [1]   %}{{x}}{%endfor%}",
     "1"},
    {"{{ {'a': {'b': 1}}}}",
     "{'a': {'b': 1}}"},
    {"{{ [1,\n  2] }}",
     "[1, 2]"},
    {"{#\nmulti\nline #}x",
     "x"},
    {"   {%- raw %}r{% endraw %}",
     "r"},
    {"{{ '{{ not a tag }}' }}{{ '{%' }}",
     "{{ not a tag }}{%"},
    {"a {{- ' b ' -}} c",
     "a b c"},
};

static const tcase STATEMENTS[] = {
    {"{% if n > 3 %}big{% elif n > 1 %}mid{% else %}small{% endif %}|{% if none %}a{% elif 0 %}b{% endif %}|{% if [] %}x{% else %}y{% endif %}",
     "big||y"},
    {"{% for x in lst %}{{ x }}{% endfor %}|{% for x in lst if x > 1 %}{{ x }}{% else %}none{% endfor %}|{% for x in empty %}{{ x }}{% else %}empty{% endfor %}",
     "312|32|empty"},
    {"{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}|{% for k in d %}{{ k }}{% endfor %}|{% for c in 'ab' %}{{ c }}.{% endfor %}",
     "b=2;a=1;items=7;|baitems|a.b."},
    {"{% for a, b in [(1, 2), [3, 4]] %}{{ a * b }};{% endfor %}|{% for (a, b), c in [((1, 2), 3)] %}{{ a }}{{ b }}{{ c }}{% endfor %}",
     "2;12;|123"},
    {"{% for x in lst %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 2 %}{% break %}{% endif %}{{ x }}{% endfor %}",
     "3"},
    {"{% for x in [1, 2] %}{% break %}{% else %}ELSE{% endfor %}|{% for x in [1, 2] %}{% if x == 1 %}{% continue %}{% endif %}{{ x }}{% else %}ELSE{% endfor %}",
     "ELSE|2"},
    {"{% set a = 1 %}{% set b, c = 2, 3 %}{{ a }}{{ b }}{{ c }}{% set t = 1, 2 %}{{ t }}",
     "123(1, 2)"},
    {"{% set ns = namespace(total=0, seen=[]) %}{% for x in lst %}{% set ns.total = ns.total + x %}{% set ns.seen = ns.seen + [x] %}{% endfor %}{{ ns.total }}{{ ns.seen }}{{ ns }}",
     "6[3, 1, 2]<Namespace {'total': 6, 'seen': [3, 1, 2]}>"},
    {"{% set x %}block {{ 1 + 1 }}{% endset %}[{{ x }}]{% set y | upper | trim %} abc {% endset %}[{{ y }}]",
     "[block 2][ABC]"},
    {"{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{{ x }}{% endfor %}{{ x }}|{% if true %}{% set z = 3 %}{% endif %}{{ z }}",
     "21|3"},
    {"{% for i in [1, 2] %}{% if i == 2 %}[{{ y }}]{% endif %}{% set y = i %}{% endfor %}",
     "[]"},
    {"{% macro m(a, b=2, c='x') %}{{ a }}-{{ b }}-{{ c }}{% endmacro %}{{ m(1) }}|{{ m(1, 3) }}|{{ m(1, c='z') }}|{{ m() }}|{{ m(b=0, a=9) }}",
     "1-2-x|1-3-x|1-2-z|-2-x|9-0-x"},
    {"{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, x=4) }}",
     "1(2, 3){'x': 4}"},
    {"{% macro fact(k) %}{% if k <= 1 %}1{% else %}{{ k * fact(k - 1)|int }}{% endif %}{% endmacro %}{{ fact(5) }}",
     "120"},
    {"{% macro later() %}{{ helper() }}{% endmacro %}{% macro helper() %}H{% endmacro %}{{ later() }}",
     "H"},
    {"{% set g = 'G' %}{% macro m() %}{{ g }}{{ i }}{% endmacro %}{% for i in [1] %}{{ m() }}{% endfor %}",
     "G"},
    {"{% macro outer() %}[{{ caller() }}]{% endmacro %}{% call outer() %}inside{% endcall %}|{% macro o2() %}[{{ caller(5) }}]{% endmacro %}{% call(v) o2() %}v={{ v }}{% endcall %}",
     "[inside]|[v=5]"},
    {"{% filter upper %}hello {{ 'world' }}{% endfilter %}|{% filter replace('a', 'b') | trim %}  banana  {% endfilter %}",
     "HELLO WORLD|bbnbnb"},
    {"{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ a }}]",
     "3[]"},
    {"{% raw %}{{ not evaluated }}{% endraw %}|{%- raw -%}  x  {%- endraw -%}|",
     "{{ not evaluated }}|x|"},
    {"{% for item in [1, [2, [3]]] recursive %}{% if item is iterable %}[{{ loop(item) }}]{% else %}{{ item }}@{{ loop.depth }}{% endif %}{% endfor %}",
     "1@1[2@2[3@3]]"},
    {"{% print 'p', 1 %}|{% block b %}in block{% endblock %}",
     "p1|in block"},
    {"{% set l = [] %}{% set _ = l.append(1) %}{% set _ = l.append(2) %}{{ l }}{{ l.pop() }}{{ l }}",
     "[1, 2]2[1]"},
    {"{% set ns = namespace() %}{% set ns.a = 1 %}{{ ns.a }}{{ ns.b is defined }}{% set n2 = namespace({'x': 1}, y=2) %}{{ n2.x }}{{ n2.y }}",
     "1False12"},
};

static const tcase LOOP[] = {
    {"{% for x in lst %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ x }};{% endfor %}",
     "1032TrueFalse33;2121FalseFalse31;3210FalseTrue32;"},
    {"{% for x in [1,2,3] %}{{ loop.previtem }}/{{ loop.nextitem }};{% endfor %}|{% for x in [1] %}{{ loop.previtem is defined }}{{ loop.nextitem is defined }}{% endfor %}",
     "/2;1/3;2/;|FalseFalse"},
    {"{% for x in [1,2,3] %}{{ loop.cycle('a', 'b') }}{% endfor %}|{% for x in [1,1,2] %}{{ loop.changed(x) }}{% endfor %}",
     "aba|TrueFalseTrue"},
    {"{% for row in [[1,2],[3]] %}{% for c in row %}{{ loop.depth }}{{ c }}{{ loop.index }}{% endfor %}{{ loop.index }};{% endfor %}",
     "1111221;1312;"},
    {"{% for x in lst if x != 3 %}{{ loop.index }}/{{ loop.length }}:{{ x }} {% endfor %}",
     "1/2:1 2/2:2 "},
    {"{{ loop is defined }}{% for x in [1] %}{{ loop is defined }}{% endfor %}{{ loop is defined }}",
     "FalseTrueFalse"},
};

static const tcase EXPRESSIONS[] = {
    {"{{ 7 // 2 }}|{{ -7 // 2 }}|{{ 7 % 3 }}|{{ -7 % 3 }}|{{ 2 ** 10 }}|{{ 2 ** -1 }}|{{ 7.5 // 2 }}|{{ 3 / 2 }}|{{ 4 / 2 }}|{{ 2 ** 3 ** 2 }}|{{ -2 ** 2 }}",
     "3|-4|1|2|1024|0.5|3.0|1.5|2.0|64|4"},
    {"{{ 1 + 2 * 3 }}|{{ (1 + 2) * 3 }}|{{ 10 - 2 - 3 }}|{{ 2 * 3 ~ 4 }}|{{ 1 ~ (2 + 3) }}|{{ 'a' ~ 1 ~ none ~ undefined_v ~ true }}",
     "7|9|5|64|15|a1NoneTrue"},
    {"{{ 1 < 2 < 3 }}|{{ 3 > 2 > 2 }}|{{ 'a' < 'b' }}|{{ [1, 2] < [1, 3] }}|{{ 1 == 1.0 }}|{{ true == 1 }}|{{ none == none }}|{{ 'a' != 'a' }}|{{ (1, 2) == [1, 2] }}",
     "True|False|True|True|True|True|True|False|False"},
    {"{{ 1 in lst }}|{{ 7 not in lst }}|{{ 'a' in d }}|{{ 'ell' in 'hello' }}|{{ '' in 'x' }}|{{ none in [none] }}|{{ 'x' in undefined_v }}",
     "True|True|True|True|True|True|False"},
    {"{{ 1 if true else 2 }}|{{ 1 if false else 2 }}|{{ 1 if false }}|{{ n > 3 and 'big' or 'small' }}|{{ not n }}|{{ not none }}|{{ none or 'x' }}|{{ 0 and 1 }}|{{ [] or [1] }}",
     "1|2||big|False|True|x|0|[1]"},
    {"{{ not 1 == 2 }}|{{ not 'a' in 'abc' }}|{{ -n|abs }}|{{ -(n) }}|{{ +n }}|{{ n * 2.0 }}|{{ 'x' * 3 }}|{{ 2 * 'y' }}|{{ [1] * 3 }}|{{ [1, 2] + [3] }}|{{ (1,) + (2,) }}",
     "True|False|5|-5|5|10.0|xxx|yy|[1, 1, 1]|[1, 2, 3]|(1, 2)"},
    {"{{ 'abc'[1] }}|{{ 'abc'[-1] }}|{{ 'abc'[::-1] }}|{{ 'abcdef'[1:4] }}|{{ 'abcdef'[::2] }}|{{ lst[::-1] }}|{{ lst[1:] }}|{{ lst[:-1] }}|{{ lst[-2:] }}|{{ lst[5:] }}|{{ lst[::-2] }}",
     "b|c|cba|bcd|ace|[2, 1, 3]|[1, 2]|[3, 1]|[1, 2]|[]|[2, 3]"},
    {"{{ u[::-1] }}|{{ u[2:5] }}|{{ u[-3:] }}|{{ u|length }}|{{ u[9] }}|{{ (1, 2, 3)[1:] }}|{{ messages[1:3]|length }}",
     "\350\252\236\346\234\254\346\227\245 \360\237\230\200 \303\251d\303\266c\303\257n\303\234|\303\257c\303\266|\346\227\245\346\234\254\350\252\236|13| |(2, 3)|2"},
    {"{{ lst[5] }}|{{ 'x'[5] }}|{{ d['zz'] }}|{{ d.zz }}|{{ none.x is defined }}|{{ nested.x.y[1].z }}|{{ nested['x']['y'][0] }}|{{ nested.x.y.1.z }}",
     "||||False|deep|1|deep"},
    {"{{ range(5)|list }}|{{ range(1, 10, 3)|list }}|{{ range(5, 0, -2)|list }}|{{ range(3) }}|{{ range(10)[2:5] }}|{{ range(3)|length }}",
     "[0, 1, 2, 3, 4]|[1, 4, 7]|[5, 3, 1]|range(0, 3)|range(2, 5)|3"},
    {"{{ dict(a=1, b=2) }}|{{ namespace(x=1).x }}|{{ {'a': 1} == {'a': 1} }}|{{ {1: 'int', 1.0: 'float', true: 'bool'} }}|{{ d|length }}",
     "{'a': 1, 'b': 2}|1|True|{1: 'bool'}|3"},
    {"{{ messages[0] == messages[0] }}|{{ messages[0] == messages[1] }}|{{ lst|list == lst }}|{{ [[1]] == [[1]] }}",
     "True|False|True|True"},
    {"{{ '%s-%d' % ('a', 3) }}|{{ '%05.1f' % 3.14159 }}|{{ '%x' % 255 }}|{{ 'x%sy' % 'z' }}|{{ '%(a)s' % {'a': 1} }}|{{ '%s' % none }}|{{ '%r' % 'q' }}|{{ '%5s|%-5s|' % ('a', 'b') }}",
     "a-3|003.1|ff|xzy|1|None|'q'|    a|b    |"},
};

static const tcase ACCESS[] = {
    {"{{ messages|length }}|{{ messages[0].role }}|{{ messages[0]['content'] }}|{{ messages[-1].content }}|{{ messages[9] }}",
     "4|system|Be brief.|{\"r\": 2}|"},
    {"{{ d.get('a') }}|{{ d.get('zz') }}|{{ d.get('zz', 'def') }}|{{ d['items'] }}|{{ d.items is defined }}|{{ d.keys()|list }}|{{ d.values()|list }}|{{ d.items()|list }}",
     "1|None|def|7|True|['b', 'a', 'items']|[2, 1, 7]|[('b', 2), ('a', 1), ('items', 7)]"},
    {"{{ d.missing is defined }}|{{ d.missing is undefined }}|{{ d.missing|default('dflt') }}|{{ (d.missing or 'or') }}",
     "False|True|dflt|or"},
    {"{{ tools[0].function.name }}|{{ tools[0]['function']['parameters']['required'] }}|{{ tools[0].function.parameters.properties.city.type }}",
     "get_weather|['city']|string"},
    {"{% set m = messages[2] %}{{ m.tool_calls[0].function.arguments.b[0] }}|{{ m.tool_calls|length }}|{{ m.content }}|{{ 'tool_calls' in m }}|{{ 'tool_calls' in messages[0] }}",
     "1.5|1|Hello!|True|False"},
    {"{{ (1, 2).count(1) }}|{{ (1, 2).index(2) }}|{{ lst.index(2) }}|{{ lst.count(1) }}|{{ d.copy() }}|{{ d.pop('b') }}{{ d }}|{{ d.setdefault('q', 0) }}",
     "1|1|2|1|{'b': 2, 'a': 1, 'items': 7}|2{'a': 1, 'items': 7}|0"},
    {"{{ range(10).stop }}|{{ [1, 2].pop(0) }}|{{ 'abc'.upper is defined }}|{{ 5.x is defined }}",
     "10|1|True|False"},
};

static const tcase FILTERS[] = {
    {"{{ s|trim }}|{{ 'xxhixx'|trim('x') }}|{{ s|length }}|{{ s|count }}|{{ lst|first }}|{{ lst|last }}|{{ 'abc'|first }}|{{ 'abc'|last }}|{{ empty|first is defined }}",
     "Hello World|hi|15|15|3|2|a|c|False"},
    {"{{ none|default('d') }}|{{ undefined_x|default('d') }}|{{ ''|default('d') }}|{{ ''|default('d', true) }}|{{ 0|d('z', boolean=true) }}|{{ undefined_x|d }}",
     "None|d||d|z|"},
    {"{{ 'hello'|capitalize }}|{{ 'hELLO wORLD-foo (bar)'|title }}|{{ 'HeLLo'|lower }}|{{ 'hello'|upper }}|{{ u|upper }}|{{ u|lower }}|{{ 'a b c'|replace(' ', '_') }}|{{ 'aaa'|replace('a', 'b', 2) }}",
     "Hello|Hello World-Foo (Bar)|hello|HELLO|\303\234N\303\217C\303\226D\303\211 \360\237\230\200 \346\227\245\346\234\254\350\252\236|\303\274n\303\257c\303\266d\303\251 \360\237\230\200 \346\227\245\346\234\254\350\252\236|a_b_c|bba"},
    {"{{ 3.7|int }}|{{ '42'|int }}|{{ ' 4_2 '|int }}|{{ '4.5'|int }}|{{ 'x'|int }}|{{ 'x'|int(7) }}|{{ '0x1A'|int(0, 16) }}|{{ none|int }}|{{ true|int }}|{{ '3.5'|float }}|{{ 3|float }}|{{ 'x'|float }}|{{ '1e3'|float }}",
     "3|42|42|4|0|7|26|0|1|3.5|3.0|0.0|1000.0"},
    {"{{ 2.5|round }}|{{ 3.5|round }}|{{ 2.675|round(2) }}|{{ 2.1|round(0, 'ceil') }}|{{ 2.9|round(method='floor') }}|{{ -3|abs }}|{{ -2.5|abs }}|{{ 5|round }}|{{ 1234|round(-2) }}",
     "2.0|4.0|2.67|3.0|2.0|3|2.5|5|1200"},
    {"{{ 'line1\\nline2\\n\\nline4'|indent(2) }}|{{ 'line1\\nline2'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(blank=true) }}|{{ 'x\\ny'|indent('> ') }}",
     "line1\n  line2\n\n  line4|  line1\n  line2|a\n    \n    b|x\n> y"},
    {"{{ lst|sort }}|{{ lst|sort(reverse=true) }}|{{ ['b', 'A', 'c']|sort }}|{{ ['b', 'A', 'c']|sort(case_sensitive=true) }}|{{ [{'n': 2}, {'n': 1}]|sort(attribute='n')|map(attribute='n')|list }}",
     "[1, 2, 3]|[3, 2, 1]|['A', 'b', 'c']|['A', 'b', 'c']|[1, 2]"},
    {"{{ lst|min }}|{{ lst|max }}|{{ lst|sum }}|{{ [1.5, 2]|sum }}|{{ [[1], [2]]|sum(start=[]) }}|{{ messages|map(attribute='content')|map('length')|sum }}|{{ ['b', 'A']|min }}|{{ empty|max is defined }}",
     "1|3|6|3.5|[1, 2]|43|A|False"},
    {"{{ messages|map(attribute='role')|list }}|{{ messages|map(attribute='role')|join(', ') }}|{{ messages|map(attribute='nope', default='-')|join }}|{{ lst|map('string')|join('+') }}|{{ ['a', 'b']|map('upper')|list }}",
     "['system', 'user', 'assistant', 'tool']|system, user, assistant, tool|----|3+1+2|['A', 'B']"},
    {"{{ messages|selectattr('role', 'equalto', 'user')|list|length }}|{{ messages|rejectattr('role', 'eq', 'user')|map(attribute='role')|list }}|{{ messages|selectattr('tool_calls', 'defined')|list|length }}|{{ messages|selectattr('tool_calls')|map(attribute='role')|first }}",
     "1|['system', 'assistant', 'tool']|1|assistant"},
    {"{{ lst|select('odd')|list }}|{{ lst|reject('odd')|list }}|{{ [0, 1, '', 'a', none]|select|list }}|{{ lst|select('lessthan', 3)|list }}|{{ none|select|list }}",
     "[3, 1]|[2]|[1, 'a']|[1, 2]|[]"},
    {"{{ [1, 2, 2, 3, 1]|unique|list }}|{{ ['a', 'A', 'b']|unique|list }}|{{ ['a', 'A']|unique(true)|list }}|{{ lst|reverse|list }}|{{ 'abc'|reverse }}",
     "[1, 2, 3]|['a', 'b']|['a', 'A']|[2, 1, 3]|cba"},
    {"{{ lst|join }}|{{ lst|join(', ') }}|{{ messages|join('/', attribute='role') }}|{{ [1, none, 'a']|join('|') }}|{{ 'abc'|join('-') }}",
     "312|3, 1, 2|system/user/assistant/tool|1|None|a|a-b-c"},
    {"{{ d|dictsort }}|{{ d|dictsort(reverse=true) }}|{{ d|dictsort(by='value') }}|{{ d|items|list }}|{{ undefined_x|items|list }}",
     "[('a', 1), ('b', 2), ('items', 7)]|[('items', 7), ('b', 2), ('a', 1)]|[('a', 1), ('b', 2), ('items', 7)]|[('b', 2), ('a', 1), ('items', 7)]|[]"},
    {"{{ lst|batch(2)|list }}|{{ [1, 2, 3, 4, 5]|batch(2, 0)|list }}|{{ lst|slice(2)|list }}|{{ [1, 2, 3, 4]|slice(3, 'x')|list }}",
     "[[3, 1], [2]]|[[1, 2], [3, 4], [5, 0]]|[[3, 1], [2]]|[[1, 2], [3, 'x'], [4, 'x']]"},
    {"{{ 'abc'|list }}|{{ d|list }}|{{ (1, 2)|list }}|{{ 'a b c'|wordcount }}|{{ 'hello world foo'|truncate(9) }}|{{ 'hello world foo bar baz'|truncate(15, true) }}|{{ 'short'|truncate(3, leeway=5) }}",
     "['a', 'b', 'c']|['b', 'a', 'items']|[1, 2]|3|hello...|hello world ...|short"},
    {"{{ 'abc'|center(9) }}|{{ '%s and %s'|format(1, 2) }}|{{ '%(x)s'|format(x='kw') }}|{{ 1|string + 'x' }}|{{ [1]|string }}|{{ none|string }}|{{ 10|string|length }}",
     "   abc   |1 and 2|kw|1x|[1]|None|2"},
    {"{{ messages|groupby('role')|map(attribute='grouper')|list }}|{% for g, items in messages|groupby('role') %}{{ g }}:{{ items|length }};{% endfor %}",
     "['assistant', 'system', 'tool', 'user']|assistant:1;system:1;tool:1;user:1;"},
    {"{{ '<b>x</b> &amp; <!-- c --> y'|striptags }}|{{ '<a>'|e }}|{{ '<a>'|escape|escape }}|{{ '<a>'|forceescape }}|{{ 42|pprint }}|{{ 'a'|pprint }}",
     "x & y|&lt;a&gt;|&lt;a&gt;|&lt;a&gt;|42|'a'"},
    {"{{ messages[0]|attr('role') is defined }}|{{ d|attr('keys') is defined }}|{{ lst|attr('x') is defined }}",
     "False|True|False"},
};

static const tcase TESTS[] = {
    {"{{ x is defined }}|{{ n is number }}|{{ n is integer }}|{{ f is float }}|{{ s is string }}|{{ d is mapping }}|{{ lst is iterable }}|{{ lst is sequence }}|{{ none is none }}|{{ true is boolean }}",
     "False|True|True|True|True|True|True|True|True|True"},
    {"{{ n is odd }}|{{ n is even }}|{{ 9 is divisibleby 3 }}|{{ 9 is divisibleby(2) }}|{{ 'a' is in 'abc' }}|{{ n is eq 5 }}|{{ n is equalto 5 }}|{{ n is ne 5 }}|{{ n is gt 3 }}|{{ n is lessthan 3 }}",
     "True|False|True|False|True|True|True|False|True|False"},
    {"{{ true is true }}|{{ 1 is true }}|{{ false is false }}|{{ 0 is false }}|{{ none is sameas none }}|{{ true is sameas true }}|{{ 'A' is upper }}|{{ 'a' is lower }}|{{ 'x'|safe is escaped }}|{{ 'x' is escaped }}",
     "True|False|True|False|True|True|True|True|True|False"},
    {"{{ d.items is callable }}|{{ 1 is callable }}|{{ 'trim' is filter }}|{{ 'nope' is filter }}|{{ 'odd' is test }}|{{ s is not string }}|{{ not s is string }}|{{ x is not defined }}",
     "True|False|True|False|True|False|False|True"},
    {"{{ true is number }}|{{ true is integer }}|{{ 1.0 is integer }}|{{ 'x' is iterable }}|{{ 5 is iterable }}|{{ d is sequence }}|{{ undefined_x is iterable }}|{{ none is mapping }}",
     "True|False|False|True|False|True|True|False"},
};

static const tcase STRINGS[] = {
    {"{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ 'xxhixx'.strip('x') }}|{{ '\\n a \\t'.strip() }}|{{ 'abc'.rstrip('c') }}|{{ '..a..'.lstrip('.') }}",
     "Hello World|Hello World  |  Hello World|hi|a|ab|a.."},
    {"{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}|{{ 'a b c'.rsplit(' ', 1) }}|{{ 'a\\nb\\r\\nc'.splitlines() }}|{{ 'x'.split('x') }}|{{ ''.split() }}|{{ '  a b  '.split(none, 1) }}",
     "['a', 'b', '', 'c']|['a', 'b']|['a', 'b c']|['a b', 'c']|['a', 'b', 'c']|['', '']|[]|['a', 'b  ']"},
    {"{{ 'Hello'.startswith('He') }}|{{ 'Hello'.endswith('lo') }}|{{ 'Hello'.startswith(('x', 'H')) }}|{{ 'Hello'.startswith('l', 2) }}|{{ 'Hello'.endswith('') }}",
     "True|True|True|True|True"},
    {"{{ 'hello world'.title() }}|{{ \"they're bill's\".title() }}|{{ 'hello WORLD'.capitalize() }}|{{ 'Hello'.upper() }}|{{ 'Hello'.lower() }}|{{ 'Hello'.swapcase() }}|{{ u.upper() }}",
     "Hello World|They'Re Bill'S|Hello world|HELLO|hello|hELLO|\303\234N\303\217C\303\226D\303\211 \360\237\230\200 \346\227\245\346\234\254\350\252\236"},
    {"{{ 'aaa'.replace('a', 'b', 2) }}|{{ 'abc'.replace('', '-') }}|{{ 'abc'.replace('x', 'y') }}|{{ 'a.b.c'.replace('.', '') }}",
     "bba|-a-b-c-|abc|abc"},
    {"{{ 'abcabc'.find('c') }}|{{ 'abcabc'.rfind('c') }}|{{ 'abc'.find('z') }}|{{ 'abcabc'.count('b') }}|{{ 'aaa'.count('') }}|{{ 'abcabc'.index('b', 2) }}|{{ u.find('\360\237\230\200') }}",
     "2|5|-1|2|4|4|8"},
    {"{{ ','.join(['a', 'b']) }}|{{ 'x'.join('abc') }}|{{ ''.join([]) }}|{{ '{} and {}'.format(1, 'two') }}|{{ '{0}{1}{0}'.format('a', 'b') }}|{{ '{name}!'.format(name='Bob') }}",
     "a,b|axbxc||1 and two|aba|Bob!"},
    {"{{ '{:>5}|{:<5}|{:^5}|{:05.2f}|{:+d}|{:,}|{:x}|{:.3}'.format('a', 'b', 'c', 3.14159, 5, 1234567, 255, 'abcdef') }}|{{ '{0[0]}-{0[1]}'.format(['p', 'q']) }}|{{ '{{}}{}'.format(1) }}",
     "    a|b    |  c  |03.14|+5|1,234,567|ff|abc|p-q|{}1"},
    {"{{ '12'.isdigit() }}|{{ 'ab'.isalpha() }}|{{ 'a1'.isalnum() }}|{{ ' '.isspace() }}|{{ 'AB'.isupper() }}|{{ 'ab'.islower() }}|{{ ''.isdigit() }}|{{ 'Ab Cd'.istitle() }}",
     "True|True|True|True|True|True|False|True"},
    {"{{ '42'.zfill(5) }}|{{ '-4'.zfill(4) }}|{{ 'ab'.center(6, '*') }}|{{ 'ab'.ljust(4) }}.|{{ 'ab'.rjust(4, '0') }}|{{ 'a=b=c'.partition('=') }}|{{ 'a=b=c'.rpartition('=') }}|{{ 'prefix-x'.removeprefix('prefix-') }}|{{ 'x.txt'.removesuffix('.txt') }}",
     "00042|-004|**ab**|ab  .|00ab|('a', '=', 'b=c')|('a=b', '=', 'c')|x|x"},
    {"{{ messages[1].content.split(' ')[0] }}|{{ messages[2].content.startswith('Hel') and messages[2].content.endswith('!') }}|{{ '</think>' in 'a</think>b' }}|{{ 'a</think>b'.split('</think>')[-1] }}|{{ '\\n\\nx'.lstrip('\\n') }}",
     "Hi|True|True|b|x"},
};

static const tcase TOJSON[] = {
    {"{{ tools|tojson }}",
     "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Get weather\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}]"},
    {"{{ tools|tojson(indent=2) }}",
     "[\n  {\n    \"type\": \"function\",\n    \"function\": {\n      \"name\": \"get_weather\",\n      \"description\": \"Get weather\",\n      \"parameters\": {\n        \"type\": \"object\",\n        \"properties\": {\n          \"city\": {\n            \"type\": \"string\"\n          }\n        },\n        \"required\": [\n          \"city\"\n        ]\n      }\n    }\n  }\n]"},
    {"{{ messages[2]|tojson(indent=4) }}",
     "{\n    \"role\": \"assistant\",\n    \"content\": \"Hello!\",\n    \"tool_calls\": [\n        {\n            \"id\": \"c1\",\n            \"type\": \"function\",\n            \"function\": {\n                \"name\": \"f\",\n                \"arguments\": {\n                    \"a\": 1,\n                    \"b\": [\n                        1.5,\n                        null,\n                        true\n                    ]\n                }\n            }\n        }\n    ]\n}"},
    {"{{ {'a': '\303\251', 'b': [1, 2.0, none, true], 'c': {}}|tojson }}|{{ 'x<y>&\\''|tojson }}|{{ '\\u0001\\n\\t\"\\\\'|tojson }}|{{ 1e100|tojson }}",
     "{\"a\": \"\303\251\", \"b\": [1, 2.0, null, true], \"c\": {}}|\"x<y>&'\"|\"\\u0001\\n\\t\\\"\\\\\"|1e+100"},
    {"{{ lst|tojson(separators=(',', ':')) }}|{{ d|tojson(sort_keys=true) }}|{{ {'\303\251': 1}|tojson(ensure_ascii=true) }}|{{ '\360\237\230\200'|tojson(ensure_ascii=true) }}|{{ {1: 2, none: 3, true: 4}|tojson }}",
     "[3,1,2]|{\"a\": 1, \"b\": 2, \"items\": 7}|{\"\\u00e9\": 1}|\"\\ud83d\\ude00\"|{\"1\": 4, \"null\": 3}"},
    {"{{ [[], {}, [[]]]|tojson(indent=2) }}|{{ 'x'|tojson(indent='--') }}|{{ [1]|tojson(indent=0) }}",
     "[\n  [],\n  {},\n  [\n    []\n  ]\n]|\"x\"|[\n1\n]"},
    {"{{ messages|selectattr('role', 'eq', 'tool')|list|tojson }}|{{ (1, 2)|tojson }}|{{ messages[2].tool_calls[0].function.arguments|tojson }}",
     "[{\"role\": \"tool\", \"content\": \"{\\\"r\\\": 2}\"}]|[1, 2]|{\"a\": 1, \"b\": [1.5, null, true]}"},
};

static const tcase MARKUP[] = {
    {"{{ '<b>'|safe }}|{{ '<b>'|safe + '<i>' }}|{{ '<i>' + '<b>'|safe }}|{{ ('<b>'|safe) ~ '<i>' }}|{{ '<b>'|safe|length }}|{{ '<b>'|safe|upper }}",
     "<b>|<b>&lt;i&gt;|&lt;i&gt;<b>|<b><i>|3|<B>"},
    {"{{ 'Use '|safe + messages[1].content + \"'\\n\"|safe + tools[0]|tojson }}",
     "Use Hi &lt;b&gt;you&lt;/b&gt; &amp; &#39;me&#39;'\n{&#34;type&#34;: &#34;function&#34;, &#34;function&#34;: {&#34;name&#34;: &#34;get_weather&#34;, &#34;description&#34;: &#34;Get weather&#34;, &#34;parameters&#34;: {&#34;type&#34;: &#34;object&#34;, &#34;properties&#34;: {&#34;city&#34;: {&#34;type&#34;: &#34;string&#34;}}, &#34;required&#34;: [&#34;city&#34;]}}}"},
    {"{{ ['<a>'|safe] }}|{{ ('<a>'|safe).replace('a', '<') }}|{{ '<a>'|safe|replace('a', '<') }}|{{ ('%s'|safe) % '<' }}|{{ ('x'|safe).join(['<', '>']) }}|{{ ('<x>'|safe).strip('<') }}",
     "[Markup('<a>')]|<&lt;>|<<>|&lt;|&lt;x&gt;|x>"},
};

static const tcase SEMANTICS[] = {
    {"{% for x in [1] %}[{{ s }}]{% endfor %}{% set s = 'new' %}{{ s }}",
     "[]new"},
    {"[{{ s }}]{% for x in [1] %}[{{ s }}]{% endfor %}{% set s = 'new' %}",
     "[  Hello World  ][  Hello World  ]"},
    {"{% for x in [1] %}[{{ s }}]{% endfor %}{% if false %}{% set s = 'new' %}{% endif %}",
     "[  Hello World  ]"},
    {"{% macro m() %}[{{ s }}]{% endmacro %}{{ m() }}{% set s = 'new' %}{{ m() }}",
     "[][new]"},
    {"{% for x in [1] %}{{ s }}{% set s = 'in' %}{{ s }}{% endfor %}{{ s }}|{% set s = s ~ '!' %}{{ s }}",
     "  Hello World  in  Hello World  |  Hello World  !"},
    {"{% for x in [1, 2] %}{% for y in [1] %}[{{ c }}]{% endfor %}{% set c = x %}{% endfor %}",
     "[][]"},
    {"{% macro m(x, y) %}{{ x }}{{ y }}{{ kwargs }}{% endmacro %}{{ m(1, x=2, z=3) }}",
     "1{'x': 2, 'z': 3}"},
    {"{{ 3[1:] }}|{{ 100[::-1] is not mapping }}|{{ none[:2] is defined }}|{{ (3[1:]) ~ 'x' }}",
     "|True|False|x"},
    {"{{ d.keys() }}|{{ d.values() }}|{{ d.items() }}|{{ d.keys()[0] is defined }}|{{ 'a' in d.keys() }}|{{ d.items()|first }}|{{ d.keys()|list }}|{{ d.values()|length }}",
     "dict_keys(['b', 'a', 'items'])|dict_values([2, 1, 7])|dict_items([('b', 2), ('a', 1), ('items', 7)])|False|True|('b', 2)|['b', 'a', 'items']|3"},
    {"{{ f is odd }}|{{ f is even }}|{{ 3 is odd }}|{{ ('<a>'|safe)|list }}|{{ ('<a>'|safe)[0] }}",
     "False|False|True|['<', 'a', '>']|<"},
    {"{{ range(3) }}|{{ range(0, 10, 3) }}|{{ range(5)[::-1] }}|{{ range(3) == [0, 1, 2] }}|{{ range(3)|list == [0, 1, 2] }}",
     "range(0, 3)|range(0, 10, 3)|range(4, -1, -1)|False|True"},
    {"{% if false %}{{ x|nosuchfilter }}{% endif %}{{ 1 if true else x|nosuchfilter }}",
     "1"},
    {"{% filter upper %}{% for x in lst %}{{ x }}{% set y = x %}{% endfor %}{% endfilter %}{{ y is defined }}",
     "312False"},
    {"{% set ns = namespace(found=false) %}{% for m in messages %}{% if m.role == 'assistant' and not ns.found %}{% set ns.found = true %}{{ loop.index0 }}{% endif %}{% endfor %}",
     "2"},
    {"{% set x = [1, 2, 3] %}{{ x|map('string')|list|tojson }}|{{ x|select('gt', 1)|map('int')|sum }}",
     "[\"1\", \"2\", \"3\"]|5"},
};

static const char *VARS_JSON = "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Hi <b>you</b> & 'me'\"}, {\"role\": \"assistant\", \"content\": \"Hello!\", \"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": {\"a\": 1, \"b\": [1.5, null, true]}}}]}, {\"role\": \"tool\", \"content\": \"{\\\"r\\\": 2}\"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Get weather\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}], \"n\": 5, \"f\": 2.5, \"s\": \"  Hello World  \", \"u\": \"\303\234n\303\257c\303\266d\303\251 \360\237\230\200 \346\227\245\346\234\254\350\252\236\", \"lst\": [3, 1, 2], \"d\": {\"b\": 2, \"a\": 1, \"items\": 7}, \"none\": null, \"empty\": [], \"nested\": {\"x\": {\"y\": [1, {\"z\": \"deep\"}]}}}";

static const ecase RUNTIME_ERRORS[] = {
    {"{{ raise_exception('System role not supported') }}",
     "TemplateError: System role not supported"},
    {"{% if messages[0].role == 'system' %}{{ raise_exception('No system: ' ~ messages[0].content) }}{% endif %}",
     "TemplateError: No system: Be brief."},
    {"{% for tool in none %}{% endfor %}",
     "TypeError: 'NoneType' object is not iterable"},
    {"{% for x in 5 %}{% endfor %}",
     "TypeError: 'int' object is not iterable"},
    {"{{ none + 1 }}",
     "TypeError: unsupported operand type(s) for +: 'NoneType' and 'int'"},
    {"{{ 'a' + 1 }}",
     "TypeError: can only concatenate str (not \"int\") to str"},
    {"{{ '<' + {} }}",
     "TypeError: can only concatenate str (not \"dict\") to str"},
    {"{{ 1 + 'a' }}",
     "TypeError: unsupported operand type(s) for +: 'int' and 'str'"},
    {"{{ [1] + 'a' }}",
     "TypeError: can only concatenate list (not \"str\") to list"},
    {"{{ 1 ~ 2 + 3 }}",
     "TypeError: can only concatenate str (not \"int\") to str"},
    {"{{ undefined_x + 1 }}",
     "UndefinedError: 'undefined_x' is undefined"},
    {"{{ undefined_x.attr }}",
     "UndefinedError: 'undefined_x' is undefined"},
    {"{{ d.missing.attr }}",
     "UndefinedError: 'dict object' has no attribute 'missing'"},
    {"{{ d.missing + 'x' }}",
     "UndefinedError: 'dict object' has no attribute 'missing'"},
    {"{{ 'p' + tools[0].description }}",
     "UndefinedError: 'dict object' has no attribute 'description'"},
    {"{{ functions + 'x' }}",
     "UndefinedError: 'functions' is undefined"},
    {"{{ tools|map(attribute='function')|tojson }}",
     "TypeError: Object of type generator is not JSON serializable"},
    {"{{ undefined_y|tojson }}",
     "TypeError: Object of type Undefined is not JSON serializable"},
    {"{{ namespace(a=1)|tojson }}",
     "TypeError: Object of type Namespace is not JSON serializable"},
    {"{{ 1 / 0 }}",
     "ZeroDivisionError: division by zero"},
    {"{{ 1 // 0 }}",
     "ZeroDivisionError: integer division or modulo by zero"},
    {"{{ 1 % 0 }}",
     "ZeroDivisionError: integer modulo by zero"},
    {"{{ 'a' < 1 }}",
     "TypeError: '<' not supported between instances of 'str' and 'int'"},
    {"{{ 5|length }}",
     "TypeError: object of type 'int' has no len()"},
    {"{{ x.y|length }}",
     "UndefinedError: 'x' is undefined"},
    {"{% set ns.a = 1 %}",
     "TemplateRuntimeError: cannot assign attribute on non-namespace object"},
    {"{% for a, b in [1, 2] %}{% endfor %}",
     "TypeError: cannot unpack non-iterable int object"},
    {"{% for a, b in [(1, 2, 3)] %}{% endfor %}",
     "ValueError: too many values to unpack (expected 2)"},
    {"{% for a, b in ['x'] %}{% endfor %}",
     "ValueError: not enough values to unpack (expected 2, got 1)"},
    {"{{ 'abc'.nope() }}",
     "UndefinedError: 'str object' has no attribute 'nope'"},
    {"{{ strftime_now('%d') }}",
     "UndefinedError: 'strftime_now' is undefined"},
    {"{{ 'x' in 5 }}",
     "TypeError: argument of type 'int' is not iterable"},
    {"{{ 1 in 'abc' }}",
     "TypeError: 'in <string>' requires string as left operand, not int"},
    {"{{ -'a' }}",
     "TypeError: bad operand type for unary -: 'str'"},
    {"{{ 'a' * 'b' }}",
     "TypeError: can't multiply sequence by non-int of type 'str'"},
    {"{{ 'abc'|batch|list }}",
     "TypeError: do_batch() missing 1 required positional argument: 'linecount'"},
    {"{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}",
     "TypeError: macro 'm' takes not more than 1 argument(s)"},
    {"{% macro m(a) %}{% endmacro %}{{ m(b=2) }}",
     "TypeError: macro 'm' takes no keyword argument 'b'"},
    {"{{ range(200000)|length }}",
     "OverflowError: Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000)."},
    {"{{ 'a'.split('') }}",
     "ValueError: empty separator"},
    {"{{ ['a', 'b']|sum }}",
     "TypeError: unsupported operand type(s) for +: 'int' and 'str'"},
    {"{{ 'x'|items|list }}",
     "TypeError: Can only get item pairs from a mapping."},
    {"{{ [{'a':1}]|unique|list }}",
     "TypeError: unhashable type: 'dict'"},
    {"{{ lst.index(9) }}",
     "ValueError: 9 is not in list"},
    {"{{ lst[1:2:0] }}",
     "ValueError: slice step cannot be zero"},
    {"{{ lst['1':] }}",
     "TypeError: slice indices must be integers or None or have an __index__ method"},
    {"{{ undefined_z[1:] }}",
     "UndefinedError: 'undefined_z' is undefined"},
    {"{{ d.pop('zz') }}",
     "KeyError: 'zz'"},
    {"{{ [].pop() }}",
     "IndexError: pop from empty list"},
    {"{% if true %}{{ 'x'|nosuchfilter }}{% endif %}",
     "TemplateRuntimeError: No filter named 'nosuchfilter' found."},
    {"{{ 'x'.format(1, 2) if false else '{0}{2}'.format(1, 2) }}",
     "IndexError: tuple index out of range"},
    {"{{ '%d' % 'x' }}",
     "TypeError: %d format: a real number is required, not str"},
    {"{{ '%s %s' % (1,) }}",
     "TypeError: not enough arguments for format string"},
    {"{{ '%s' % (1, 2) }}",
     "TypeError: not all arguments converted during string formatting"},
    {"{{ lst|sort(attribute='x')|list }}{{ [1, 'a']|sort }}",
     "TypeError: '<' not supported between instances of 'str' and 'int'"},
    {"{% filter length %}ab{% endfilter %}",
     "TypeError: sequence item 0: expected str instance, int found"},
    {"{% macro m() %}{% endmacro %}{% call m() %}x{% endcall %}",
     "TypeError: macro 'm' was invoked with two values for the special caller argument. This is most likely a bug."},
    {"{{ d.keys()|tojson }}",
     "TypeError: Object of type dict_keys is not JSON serializable"},
    {"{{ d.keys()[1:] }}",
     "TypeError: 'dict_keys' object is not subscriptable"},
    {"{{ 'x'|center(1, 2) }}",
     "TypeError: do_center() takes from 1 to 2 positional arguments but 3 were given"},
    {"{{ 3[1:] ~ x }}",
     "TypeError: 'int' object is not subscriptable"},
    {"{% for x in [1] %}{{ s.x }}{% endfor %}{% set s = 'new' %}",
     "UndefinedError: 's' is undefined"},
};

/* Renders src with the variables of a JSON object (NULL: VARS_JSON). */
static int render_with(const char *src, const char *vars_json, const jinja_limits *lim,
                       char **out, size_t *out_len)
{
    json_error_t jerr;
    json_t *vars = json_loads(vars_json ? vars_json : VARS_JSON, 0, &jerr);
    if (!vars)
        FAIL("bad test variables: %s", jerr.text);
    jinja_var v[32];
    size_t n = 0;
    const char *key;
    json_t *val;
    json_object_foreach(vars, key, val) {
        if (n < 32) {
            v[n].name = key;
            v[n++].value = val;
        }
    }
    jinja_template *t = NULL;
    *out = NULL;
    int rc = jinja_parse(src, strlen(src), &t);
    if (rc == 0)
        rc = jinja_render(t, v, n, lim, out, out_len);
    jinja_free(t);
    json_decref(vars);
    return rc;
}

static void show(const char *label, const char *s)
{
    fprintf(stderr, "      %s: \"", label);
    for (int n = 0; s && *s; s++, n++) {
        if (n == 300) {
            fputs("...", stderr);
            break;
        }
        if (*s == '\n')
            fputs("\\n", stderr);
        else
            fputc(*s, stderr);
    }
    fputs("\"\n", stderr);
}

static void run_table(const char *group, const tcase *t, size_t n)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        char *out;
        int rc = render_with(t[i].src, NULL, NULL, &out, NULL);
        if (rc == 0 && strcmp(out, t[i].expect) == 0) {
            rc_free(out);
            continue;
        }
        bad++;
        fprintf(stderr, "  %s case %zu:\n", group, i);
        show("template", t[i].src);
        if (rc < 0)
            fprintf(stderr, "      error %d: %s\n", rc, rc_errmsg());
        else
            show("got     ", out);
        show("expected", t[i].expect);
        rc_free(out);
    }
    CHECK_INT(bad, ==, 0);
}

#define RUN(group, table) run_table(group, table, sizeof table / sizeof table[0])

TEST(template_literals) { RUN("literals", LITERALS); }
TEST(template_whitespace) { RUN("whitespace", WHITESPACE); }
TEST(template_statements) { RUN("statements", STATEMENTS); }
TEST(template_loop) { RUN("loop", LOOP); }
TEST(template_expressions) { RUN("expressions", EXPRESSIONS); }
TEST(template_access) { RUN("access", ACCESS); }
TEST(template_filters) { RUN("filters", FILTERS); }
TEST(template_tests) { RUN("tests", TESTS); }
TEST(template_strings) { RUN("strings", STRINGS); }
TEST(template_tojson) { RUN("tojson", TOJSON); }
TEST(template_markup) { RUN("markup", MARKUP); }
TEST(template_semantics) { RUN("semantics", SEMANTICS); }

/* Run-time errors: the message must contain Python's "<Class>: <text>"
 * (other run-time errors also name the template line). */
TEST(template_runtime_errors)
{
    size_t bad = 0;
    for (size_t i = 0; i < sizeof RUNTIME_ERRORS / sizeof RUNTIME_ERRORS[0]; i++) {
        const ecase *e = &RUNTIME_ERRORS[i];
        char *out;
        int rc = render_with(e->src, NULL, NULL, &out, NULL);
        if (rc == RC_EINVAL && strstr(rc_errmsg(), e->message)) {
            /* raise_exception's message is passed through untouched */
            if (strncmp(e->message, "TemplateError: ", 15) == 0 && strcmp(rc_errmsg(), e->message)) {
                fprintf(stderr, "  raise_exception message altered: \"%s\"\n", rc_errmsg());
                bad++;
            }
            continue;
        }
        bad++;
        fprintf(stderr, "  error case %zu:\n", i);
        show("template", e->src);
        if (rc == 0)
            show("rendered", out);
        else
            fprintf(stderr, "      error %d: %s\n", rc, rc_errmsg());
        show("expected", e->message);
        rc_free(out);
    }
    CHECK_INT(bad, ==, 0);
    /* the line of the failing expression is reported */
    char *out;
    CHECK_INT(render_with("a\nb\n{{ 1 }}\n{{ none + 1 }}", NULL, NULL, &out, NULL), ==, RC_EINVAL);
    CHECK(strstr(rc_errmsg(), "(template line 4)") != NULL);
}

static void check_syntax(const char *src, const char *message, const char *where)
{
    char *out;
    int rc = render_with(src, NULL, NULL, &out, NULL);
    if (rc != RC_EFORMAT || !strstr(rc_errmsg(), message) || !strstr(rc_errmsg(), where)) {
        show("template", src);
        FAIL("rc %d, \"%s\"; expected RC_EFORMAT with \"%s\" and \"%s\"", rc, rc_errmsg(),
             message, where);
    }
}

TEST(template_syntax_errors)
{
    check_syntax("{{ x", "unexpected end of template, expected 'end of print statement'", "line 1");
    check_syntax("ok\n{% if x %}open", "Unexpected end of template. Jinja was looking for the "
                 "following tags: 'elif' or 'else' or 'endif'. The innermost block that needs "
                 "to be closed is 'if'.", "line 2");
    check_syntax("{% for x in y %}{% endif %}", "Encountered unknown tag 'endif'. Jinja was looking "
                 "for the following tags: 'endfor' or 'else'.", "line 1, column 20");
    check_syntax("{% endfor %}", "Encountered unknown tag 'endfor'.", "line 1");
    check_syntax("{% frobnicate %}", "Encountered unknown tag 'frobnicate'.", "column 4");
    check_syntax("{{ 'x'|nosuchfilter }}", "TemplateAssertionError: No filter named 'nosuchfilter'.",
                 "line 1, column 8");
    check_syntax("\n  {{ x is nosuchtest }}", "No test named 'nosuchtest'.", "line 2, column 11");
    check_syntax("{{ 1 + }}", "unexpected 'end of print statement'", "line 1, column 8");
    check_syntax("{{ (1 }}", "unexpected '}', expected ')'", "line 1");
    check_syntax("{{ x ! y }}", "unexpected char '!'", "column 6");
    check_syntax("{# never closed", "Missing end of comment tag", "line 1");
    check_syntax("{% raw %}never closed", "Missing end of raw directive", "line 1");
    check_syntax("{{ 'unterminated }}", "unexpected char", "column 4");
    check_syntax("{% break %}", "'break' outside loop", "line 1");
    check_syntax("{% for x in y %}{% macro m() %}{% continue %}{% endmacro %}{% endfor %}",
                 "'continue' outside loop", "line 1");
    check_syntax("{% set 1 = 2 %}", "can't assign to 'const'", "line 1");
    check_syntax("{% macro m(a=1, b) %}{% endmacro %}", "non-default argument follows default argument",
                 "line 1");
    check_syntax("{% include 'x' %}", "not supported", "line 1");
    check_syntax("{{ '\\xZZ' }}", "truncated \\xXX escape", "line 1");
    check_syntax("{{ 99999999999999999999 }}", "does not fit in 64 bits", "line 1");
    check_syntax("bad \xff byte", "not valid UTF-8", "");
    /* a parse error wins over an unknown filter seen earlier, as in jinja2 */
    check_syntax("{{ x|nosuch }}{% if %}", "Expected an expression", "line 1");
    /* unknown filters inside if statements fail only when they run */
    char *out;
    CHECK_OK(render_with("{% if false %}{{ x|nosuch }}{% endif %}ok", NULL, NULL, &out, NULL));
    CHECK_STR(out, "ok");
    rc_free(out);
}

static void check_limit(const char *src, const jinja_limits *lim)
{
    char *out;
    int rc = render_with(src, NULL, lim, &out, NULL);
    if (rc != RC_ELIMIT) {
        show("template", src);
        FAIL("expected RC_ELIMIT, got %d: %s", rc, rc == 0 ? "(rendered)" : rc_errmsg());
    }
}

/* Hostile templates stop with RC_ELIMIT, quickly and without crashing. */
TEST_T(template_limits, 120)
{
    jinja_limits small = {0};
    small.max_steps = 2000000;
    small.max_output_bytes = 1 << 20;
    small.max_memory_bytes = 64 << 20;
    /* unbounded recursion */
    check_limit("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL);
    check_limit("{% macro f() %}{{ f() }}{{ f() }}{% endmacro %}{{ f() }}", &small);
    /* loops that would run for hours */
    check_limit("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
                &small);
    check_limit("{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}",
                NULL);
    /* output and memory growth */
    check_limit("{% set ns = namespace(s='xx') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
                "{% endfor %}{{ ns.s|length }}", NULL);
    check_limit("{{ 'x' * 10000000000 }}", NULL);
    check_limit("{% set ns = namespace(l=[1]) %}{% for i in range(60) %}{% set ns.l = ns.l + ns.l %}"
                "{% endfor %}", &small);
    check_limit("{{ 'x'.center(1000000000000) }}", NULL);
    check_limit("{{ '%99999999999d' % 1 }}", NULL);
    /* a list that contains itself cannot be printed forever */
    check_limit("{% set l = [] %}{% set _ = l.append(l) %}{{ l }}", NULL);
    check_limit("{% set l = [] %}{% set _ = l.append(l) %}{{ l|tojson }}", NULL);
    /* deeply nested source */
    char *deep = malloc(200000);
    strcpy(deep, "{{ ");
    for (int i = 0; i < 5000; i++)
        strcat(deep + 3 + i, "(");
    check_limit(deep, NULL);
    strcpy(deep, "");
    for (int i = 0; i < 3000; i++)
        strcat(deep, "{% if 1 %}");
    check_limit(deep, NULL);
    strcpy(deep, "{{ x");
    for (int i = 0; i < 20000; i++)
        strcat(deep + 4 + i * 6, "|trim ");
    strcat(deep, "}}");
    check_limit(deep, NULL);    /* a long filter chain is deep at run time */
    strcpy(deep, "{{ 1");
    for (int i = 0; i < 20000; i++)
        strcat(deep + 4 + i * 4, " + 1");
    strcat(deep, " }}");
    check_limit(deep, NULL);
    free(deep);
    /* ordinary integer overflow is reported, not wrapped */
    char *out;
    CHECK_INT(render_with("{{ 9223372036854775807 + 1 }}", NULL, NULL, &out, NULL), ==, RC_ELIMIT);
    CHECK(strstr(rc_errmsg(), "OverflowError") != NULL);
}

/* The high-level API with the variables transformers passes. */
TEST(template_chat_api)
{
    json_t *msgs = json_loads("[{\"role\":\"user\",\"content\":\"Hi\"}]", 0, NULL);
    json_t *tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]", 0, NULL);
    json_t *extra = json_loads("{\"enable_thinking\": false, \"bos_token\": \"ignored\"}", 0, NULL);
    char *out = NULL;
    const char *tpl =
        "{{ bos_token }}|{{ eos_token is defined }}|{{ tools is none }}|{{ add_generation_prompt }}|"
        "{% for m in messages %}{{ m.role }}:{{ m.content }}{% endfor %}|"
        "{{ enable_thinking is defined and enable_thinking is false }}|{{ documents is defined }}";
    CHECK_OK(chat_template_render(tpl, msgs, NULL, true, "<s>", NULL, extra, &out));
    CHECK_STR(out, "<s>|False|True|True|user:Hi|True|False");
    rc_free(out);
    CHECK_OK(chat_template_render("{{ tools|tojson }}{{ bos_token }}", msgs, tools, false, NULL,
                                  NULL, NULL, &out));
    CHECK_STR(out, "[{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]");
    rc_free(out);
    /* errors */
    CHECK_INT(chat_template_render("{{ raise_exception('Bad role: ' ~ messages[0].role) }}",
                                   msgs, NULL, false, NULL, NULL, NULL, &out), ==, RC_EINVAL);
    CHECK_STR(rc_errmsg(), "TemplateError: Bad role: user");
    CHECK(out == NULL);
    CHECK_INT(chat_template_render("{% for t in tools %}{% endfor %}", msgs, NULL, false, NULL,
                                   NULL, NULL, &out), ==, RC_EINVAL);
    CHECK(strstr(rc_errmsg(), "TypeError: 'NoneType' object is not iterable") != NULL);
    CHECK_INT(chat_template_render("line\n{% if %}", msgs, NULL, false, NULL, NULL, NULL, &out),
              ==, RC_EFORMAT);
    CHECK(strstr(rc_errmsg(), "TemplateSyntaxError") && strstr(rc_errmsg(), "line 2"));
    CHECK_INT(chat_template_render("x", msgs, NULL, false, NULL, NULL, tools, &out), ==, RC_EINVAL);
    json_decref(msgs);
    json_decref(tools);
    json_decref(extra);
}

/* Every allocation failure is reported cleanly and leaks nothing (the
 * sanitizer build checks the leaks). */
TEST_T(template_alloc_failures, 120)
{
    const char *src =
        "{% macro m(x, y='d') %}<{{ x }}{{ y }}>{% endmacro %}"
        "{% set ns = namespace(n=0, l=[]) %}"
        "{% for msg in messages if msg.role != 'tool' %}{% set ns.n = ns.n + 1 %}"
        "{% set ns.l = ns.l + [msg.role] %}{{ m(msg.content|trim, loop.index) }}"
        "{{ msg|tojson(indent=2) }}{{ msg.content.split(' ')|join('_') }}{% endfor %}"
        "{{ ns.l|unique|list }}{{ tools|map(attribute='function')|list }}{{ d|dictsort }}"
        "{% set b %}{{ u[::-1] }}{{ '%s=%d' % ('k', 3) }}{% endset %}{{ b|upper }}"
        "{% set cyc = [] %}{% set _ = cyc.append(cyc) %}";
    char *expect = NULL;
    CHECK_OK(render_with(src, NULL, NULL, &expect, NULL));
    int n_ok = 0;
    for (long n = 0; n < 100000; n++) {
        char *out = NULL;
        rc_mem_fail_after(n);
        int rc = render_with(src, NULL, NULL, &out, NULL);
        rc_mem_fail_after(-1);
        if (rc == 0) {
            CHECK_STR(out, expect);
            rc_free(out);
            if (++n_ok == 3)
                break;
            continue;
        }
        if (rc != RC_ENOMEM)
            FAIL("allocation failure %ld gave %d: %s", n, rc, rc_errmsg());
        CHECK(out == NULL);
    }
    CHECK_INT(n_ok, >, 0);
    rc_free(expect);
}

typedef struct { const jinja_template *t; const jinja_var *v; size_t n; char *out; int rc; } job;

static void *render_job(void *arg)
{
    job *j = arg;
    for (int i = 0; i < 50 && j->rc == 0; i++) {
        rc_free(j->out);
        j->out = NULL;
        j->rc = jinja_render(j->t, j->v, j->n, NULL, &j->out, NULL);
    }
    return NULL;
}

/* A parsed template is shared by threads rendering at the same time. */
TEST(template_threads)
{
    const char *src = "{% for m in messages %}{{ m.role|upper ~ ': ' ~ m.content }}\n{% endfor %}"
                      "{{ 'done' if add_generation_prompt else 'x' }}";
    jinja_template *t;
    CHECK_OK(jinja_parse(src, strlen(src), &t));
    json_t *msgs = json_loads("[{\"role\":\"user\",\"content\":\"a\"},"
                              "{\"role\":\"assistant\",\"content\":\"b\"}]", 0, NULL);
    jinja_var v[2] = {{"messages", msgs}, {"add_generation_prompt", json_true()}};
    job jobs[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (job){t, v, 2, NULL, 0};
        CHECK(pthread_create(&th[i], NULL, render_job, &jobs[i]) == 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK_INT(jobs[i].rc, ==, 0);
        CHECK_STR(jobs[i].out, "USER: a\nASSISTANT: b\ndone");
        rc_free(jobs[i].out);
    }
    json_decref(msgs);
    jinja_free(t);
}
