/*
 * xml_check: a tiny XML well-formedness checker for the test suites that write SVG
 * (test_svg, test_keepmap): balanced and properly nested tags, quoted attributes, valid
 * entities, exactly one root element. Test support only, not part of libkvrt.
 */
#include "xml_check.h"

#include <stdio.h>
#include <string.h>


static int is_name_char(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       c == '_' || c == '-' || c == ':' || c == '.';
}

/* Checks an entity reference at s ('&'); returns its length or 0 if invalid. */
static size_t entity_len(const char *s)
{
	static const char *const ents[] = {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"};
	for (int i = 0; i < 5; i++)
		if (!strncmp(s, ents[i], strlen(ents[i])))
			return strlen(ents[i]);
	if (s[1] == '#') {
		size_t i = 2;
		int hex = s[2] == 'x';
		if (hex)
			i++;
		size_t st = i;
		while ((s[i] >= '0' && s[i] <= '9') ||
		       (hex && ((s[i] >= 'a' && s[i] <= 'f') || (s[i] >= 'A' && s[i] <= 'F'))))
			i++;
		if (i > st && s[i] == ';')
			return i + 1;
	}
	return 0;
}

/* Returns NULL when xml is well-formed, else a static message. */
const char *xml_check(const char *xml)
{
	static char msg[256];
	char stack[64][32];
	int depth = 0, roots = 0;
	const char *p = xml;
	while (*p) {
		if (*p == '<') {
			if (!strncmp(p, "<?", 2)) {
				const char *e = strstr(p, "?>");
				if (!e)
					return "unterminated <?";
				p = e + 2;
				continue;
			}
			if (!strncmp(p, "<!--", 4)) {
				const char *e = strstr(p, "-->");
				if (!e)
					return "unterminated comment";
				p = e + 3;
				continue;
			}
			int closing = p[1] == '/';
			p += closing ? 2 : 1;
			char name[32];
			size_t n = 0;
			while (is_name_char(*p) && n < sizeof(name) - 1)
				name[n++] = *p++;
			name[n] = '\0';
			if (n == 0)
				return "empty tag name";
			if (closing) {
				while (*p == ' ')
					p++;
				if (*p != '>')
					return "junk in end tag";
				p++;
				if (depth == 0 || strcmp(stack[depth - 1], name)) {
					snprintf(msg, sizeof(msg), "</%s> does not close <%s>", name,
					         depth ? stack[depth - 1] : "(nothing)");
					return msg;
				}
				depth--;
				continue;
			}
			if (depth == 0)
				roots++;
			for (;;) {
				while (*p == ' ' || *p == '\n' || *p == '\t')
					p++;
				if (*p == '>') {
					if (depth == 64)
						return "too deep";
					snprintf(stack[depth++], 32, "%s", name);
					p++;
					break;
				}
				if (p[0] == '/' && p[1] == '>') {
					p += 2;
					break;
				}
				size_t an = 0;
				while (is_name_char(*p)) {
					p++;
					an++;
				}
				if (an == 0 || *p != '=') {
					snprintf(msg, sizeof(msg), "bad attribute in <%s>", name);
					return msg;
				}
				p++;
				char q = *p;
				if (q != '"' && q != '\'')
					return "unquoted attribute value";
				p++;
				while (*p && *p != q) {
					if (*p == '<')
						return "'<' inside an attribute value";
					if (*p == '&') {
						size_t el = entity_len(p);
						if (!el)
							return "bad entity in attribute";
						p += el;
						continue;
					}
					p++;
				}
				if (*p != q)
					return "unterminated attribute value";
				p++;
			}
		} else if (*p == '&') {
			size_t el = entity_len(p);
			if (!el)
				return "bad entity in text";
			p += el;
		} else {
			if (depth == 0 && !(*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r'))
				return "text outside the root element";
			p++;
		}
	}
	if (depth)
		return "unclosed elements at end";
	if (roots != 1)
		return "not exactly one root element";
	return NULL;
}
