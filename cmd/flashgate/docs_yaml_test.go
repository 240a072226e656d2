package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extauthzv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_authz/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"github.com/goccy/go-yaml"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"

	// Every extension a typed_config of the docs names must be registered in
	// protoregistry.GlobalTypes, or protojson cannot resolve its @type.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
)

// docBlock is one fenced block of a Markdown file.
type docBlock struct {
	file string
	line int    // of the opening fence
	lang string // the fence's info string: yaml, sh, "" …
	text string
}

func (b docBlock) where() string {
	return strings.TrimPrefix(b.file, "../../") + ":" + strconv.Itoa(b.line)
}

// docFiles lists the Markdown files whose examples the tests check: the
// README, BENCHMARKS.md, the wiring READMEs and every page under docs/ (and
// a chart's README), whichever exist.
func docFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	for _, f := range []string{"../../README.md", "../../BENCHMARKS.md", "../../envoy/README.md", "../../k8s/README.md"} {
		if _, err := os.Stat(f); err == nil {
			files = append(files, f)
		}
	}
	for _, pattern := range []string{"../../docs/*.md", "../../docs/*/*.md", "../../charts/*/README.md"} {
		more, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, more...)
	}
	return files
}

// fencedBlocks returns the fenced blocks of a Markdown file, indented ones
// (inside a list item) included.
func fencedBlocks(t *testing.T, file string) []docBlock {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out []docBlock
	var cur *docBlock
	var indent string
	for i, line := range strings.Split(string(data), "\n") {
		trimmed := strings.TrimLeft(line, " ")
		switch {
		case cur == nil && strings.HasPrefix(trimmed, "```"):
			lang := strings.TrimSpace(strings.TrimPrefix(trimmed, "```"))
			cur, indent = &docBlock{file: file, line: i + 1, lang: lang}, line[:len(line)-len(trimmed)]
		case cur != nil && strings.HasPrefix(trimmed, "```"):
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.text += strings.TrimPrefix(line, indent) + "\n"
		}
	}
	if cur != nil {
		t.Fatalf("%s:%d: a ``` block is not closed", file, cur.line)
	}
	return out
}

// yamlBlocks returns the ```yaml blocks of a Markdown file.
func yamlBlocks(t *testing.T, file string) []docBlock {
	t.Helper()
	var out []docBlock
	for _, b := range fencedBlocks(t, file) {
		if b.lang == "yaml" || b.lang == "yml" {
			out = append(out, b)
		}
	}
	return out
}

// configFile matches a block that is a descriptors file or a ratelimit
// config: one with a top-level domain key.
var configFile = regexp.MustCompile(`(?m)^domain:`)

// TestDocsYAMLValidate: every ```yaml block of README.md and of the docs
// parses as YAML, and each that is a config file (a top-level `domain:`)
// passes `flashgate validate`, with --config (a descriptors file) or
// --rls-config (a ratelimit config); a block passing neither fails the test
// with both errors. Envoy fragments are checked by
// TestDocsEnvoySnippets, Kubernetes ones by k8s/.
func TestDocsYAMLValidate(t *testing.T) {
	configs := 0
	for _, f := range docFiles(t) {
		for _, b := range yamlBlocks(t, f) {
			if err := parseYAMLDocs(b.text); err != nil {
				t.Errorf("%s: the block is not YAML: %v\n%s", b.where(), err, b.text)
				continue
			}
			if !configFile.MatchString(b.text) {
				continue
			}
			configs++
			t.Run(b.where(), func(t *testing.T) {
				if err := validateConfigBlock(t, b.text); err != nil {
					t.Errorf("%v\n%s", err, b.text)
				}
			})
		}
	}
	if configs < 3 {
		t.Errorf("%d config blocks found, want at least the README's rule and the configuration page's examples", configs)
	}
}

// parseYAMLDocs parses every document of a YAML text (duplicate keys are
// errors).
func parseYAMLDocs(text string) error {
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(text, -1) {
		var v any
		if err := yaml.Unmarshal([]byte(doc), &v); err != nil {
			return err
		}
	}
	return nil
}

// validateConfigBlock runs `flashgate validate` on text as a descriptors
// file, then as a ratelimit config directory; nil when either accepts it.
func validateConfigBlock(t *testing.T, text string) error {
	dir := t.TempDir()
	path := filepath.Join(dir, "block.yaml")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	var errs []string
	for _, args := range [][]string{{"--config", path}, {"--rls-config", dir}} {
		var stdout, stderr strings.Builder
		err := runEnv(context.Background(), append([]string{"validate"}, args...),
			env{stdout: &stdout, stderr: &stderr, lookupEnv: func(string) (string, bool) { return "", false }})
		if err == nil {
			return nil
		}
		errs = append(errs, args[0]+": "+stderr.String()+errorLine(err))
	}
	return fmt.Errorf("neither a valid descriptors file nor a valid ratelimit config:\n%s", strings.Join(errs, "\n"))
}

func TestValidateConfigBlockRefusesABadRule(t *testing.T) {
	bad := "domain: shop\ndescriptors:\n  - key: remote_address\n    rate_limit: {requests: 5, window: 1s, burst: 2}\n"
	if err := validateConfigBlock(t, bad); err == nil || !strings.Contains(err.Error(), "burst") {
		t.Errorf("validateConfigBlock(unknown key burst) = %v, want an error naming it", err)
	}
}

// envoyWrappers are the top-level keys under which a docs block may give an
// Envoy fragment: each value is a list of the message the key holds in
// Envoy's config.
var envoyWrappers = map[string]func() proto.Message{
	"http_filters": func() proto.Message { return &hcmv3.HttpFilter{} },
	"clusters":     func() proto.Message { return &clusterv3.Cluster{} },
	"routes":       func() proto.Message { return &routev3.Route{} },
	"rate_limits":  func() proto.Message { return &routev3.RateLimit{} },
}

// envoyListItems are the messages a bare YAML list of an Envoy fragment may
// hold, tried in turn.
var envoyListItems = []func() proto.Message{
	func() proto.Message { return &hcmv3.HttpFilter{} },
	func() proto.Message { return &routev3.Route{} },
	func() proto.Message { return &clusterv3.Cluster{} },
	func() proto.Message { return &routev3.RateLimit{} },
}

// envoyMappings are the messages a bare YAML mapping of an Envoy fragment
// may be, tried in turn: a whole bootstrap, or the ext_authz filter's
// config.
var envoyMappings = []func() proto.Message{
	func() proto.Message { return &bootstrapv3.Bootstrap{} },
	func() proto.Message { return &extauthzv3.ExtAuthz{} },
}

// isEnvoyBlock: the block is Envoy configuration (it names an Envoy type, or
// is a bootstrap), and not a Kubernetes object that embeds some.
func isEnvoyBlock(text string) bool {
	if regexp.MustCompile(`(?m)^apiVersion:`).MatchString(text) {
		return false
	}
	return strings.Contains(text, "type.googleapis.com/envoy.") ||
		regexp.MustCompile(`(?m)^(static_resources|http_filters|clusters):`).MatchString(text)
}

// checkEnvoyBlock decodes an Envoy fragment strictly into Envoy's protos and
// validates it, every Any inside included.
func checkEnvoyBlock(text string) error {
	js, err := yaml.YAMLToJSON([]byte(text))
	if err != nil {
		return err
	}
	var top any
	if err := json.Unmarshal(js, &top); err != nil {
		return err
	}
	switch v := top.(type) {
	case []any:
		return checkEnvoyList(v, envoyListItems)
	case map[string]any:
		wrapped := 0
		for key, val := range v {
			mk, ok := envoyWrappers[key]
			if !ok {
				continue
			}
			wrapped++
			list, ok := val.([]any)
			if !ok {
				return fmt.Errorf("%s: not a list", key)
			}
			if err := checkEnvoyList(list, []func() proto.Message{mk}); err != nil {
				return fmt.Errorf("%s: %w", key, err)
			}
		}
		if wrapped > 0 {
			if wrapped != len(v) {
				return fmt.Errorf("a block of %v mixes Envoy fragments with other keys", keysOf(v))
			}
			return nil
		}
		return decodeFirst(js, envoyMappings)
	}
	return fmt.Errorf("neither a list nor a mapping")
}

func keysOf(m map[string]any) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

// checkEnvoyList decodes every item of list as one of the messages of mks
// (the same one for every item).
func checkEnvoyList(list []any, mks []func() proto.Message) error {
	var errs []string
	for _, mk := range mks {
		var err error
		for i, item := range list {
			js, _ := json.Marshal(item)
			if err = decodeFirst(js, []func() proto.Message{mk}); err != nil {
				err = fmt.Errorf("item %d: %w", i, err)
				break
			}
		}
		if err == nil {
			return nil
		}
		errs = append(errs, err.Error())
	}
	return fmt.Errorf("no Envoy message fits: %s", strings.Join(errs, "; "))
}

// decodeFirst decodes js strictly into the first message of mks that takes
// it and validates that; the error says why none did.
func decodeFirst(js []byte, mks []func() proto.Message) error {
	var errs []string
	for _, mk := range mks {
		m := mk()
		name := string(m.ProtoReflect().Descriptor().FullName())
		if err := protojson.Unmarshal(js, m); err != nil {
			errs = append(errs, name+": "+err.Error())
			continue
		}
		if err := validateDeep(m); err != nil {
			return err
		}
		return nil
	}
	return fmt.Errorf("%s", strings.Join(errs, "; "))
}

// validateDeep runs ValidateAll on m and on the message packed in every Any
// reachable from it: protoc-gen-validate checks only an Any's type URL.
func validateDeep(m proto.Message) error {
	if v, ok := m.(interface{ ValidateAll() error }); ok {
		if err := v.ValidateAll(); err != nil {
			return fmt.Errorf("%s: %w", m.ProtoReflect().Descriptor().FullName(), err)
		}
	}
	var err error
	var walk func(protoreflect.Message) bool
	visit := func(v protoreflect.Message) bool {
		if a, ok := v.Interface().(*anypb.Any); ok {
			inner, uerr := anypb.UnmarshalNew(a, proto.UnmarshalOptions{})
			if uerr != nil {
				err = fmt.Errorf("unpack %s: %w", a.GetTypeUrl(), uerr)
			} else {
				err = validateDeep(inner)
			}
			return err == nil
		}
		return walk(v)
	}
	walk = func(m protoreflect.Message) bool {
		m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
			switch {
			case fd.IsList() && fd.Message() != nil:
				for i := 0; i < v.List().Len() && err == nil; i++ {
					visit(v.List().Get(i).Message())
				}
			case fd.IsMap() && fd.MapValue().Message() != nil:
				v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool { return visit(mv.Message()) })
			case fd.Message() != nil && !fd.IsMap():
				visit(v.Message())
			}
			return err == nil
		})
		return err == nil
	}
	walk(m.ProtoReflect())
	return err
}

// TestDocsEnvoySnippets: every Envoy fragment of the docs (a bootstrap, the
// HTTP filters, clusters, routes or rate_limits lists, or the ext_authz
// filter's config) decodes strictly into Envoy's protos, as go-control-plane
// has them, and passes their validation. A Pod's `containers:` fragment is
// checked by k8s/ (TestDocsPodFragments).
func TestDocsEnvoySnippets(t *testing.T) {
	envoy := 0
	for _, f := range docFiles(t) {
		for _, b := range yamlBlocks(t, f) {
			if isEnvoyBlock(b.text) {
				envoy++
				if err := checkEnvoyBlock(b.text); err != nil {
					t.Errorf("%s: an Envoy fragment that Envoy's protos refuse: %v\n%s", b.where(), err, b.text)
				}
			}
		}
	}
	if envoy < 3 {
		t.Errorf("%d Envoy fragments checked; want the README's filter and cluster and envoy/README.md's", envoy)
	}
}

func TestCheckEnvoyBlockRefusesMistakes(t *testing.T) {
	for name, text := range map[string]string{
		"misspelt field":         "http_filters:\n  - name: envoy.filters.http.ext_authz\n    typed_config:\n      \"@type\": type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz\n      grpc_servce: {envoy_grpc: {cluster_name: flashgate}}\n",
		"invalid inside an Any":  "http_filters:\n  - name: envoy.filters.http.ext_authz\n    typed_config:\n      \"@type\": type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz\n      grpc_service: {envoy_grpc: {cluster_name: \"\"}}\n",
		"cluster without a name": "clusters:\n  - type: STATIC\n    connect_timeout: 0.25s\n",
		"unknown top-level key":  "static_resources: {}\nadmin_port: 9901\n",
	} {
		if err := checkEnvoyBlock(text); err == nil {
			t.Errorf("%s: checkEnvoyBlock accepted\n%s", name, text)
		}
	}
}

// shellLangs are the fences whose lines are shell commands.
var shellLangs = map[string]bool{"sh": true, "bash": true, "shell": true, "console": true}

// flashgateBinary names the flashgate binary in a command line.
var flashgateBinary = map[string]bool{
	"flashgate": true, "./cmd/flashgate": true, "bin/flashgate": true, "./bin/flashgate": true,
	"/usr/local/bin/flashgate": true,
}

// shellWords splits one command line into words, honouring quotes, and into
// commands at unquoted |, ;, & and a # comment.
func shellWords(line string) [][]string {
	var cmds [][]string
	var words []string
	var cur strings.Builder
	inWord := false
	var quote rune
	flushWord := func() {
		if inWord {
			words = append(words, cur.String())
		}
		cur.Reset()
		inWord = false
	}
	flushCmd := func() {
		flushWord()
		if len(words) > 0 {
			cmds = append(cmds, words)
		}
		words = nil
	}
	for _, r := range line {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			} else {
				cur.WriteRune(r)
			}
		case r == '\'' || r == '"':
			quote, inWord = r, true
		case r == ' ' || r == '\t':
			flushWord()
		case r == '|' || r == ';' || r == '&' || r == '(' || r == ')':
			flushCmd()
		case r == '#' && !inWord:
			flushCmd()
			return cmds
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	flushCmd()
	return cmds
}

// shellCommands returns the flashgate command lines of a shell block (lines
// joined at a trailing backslash; a console's "$ " prompt dropped), each as
// the words after the binary's name.
func shellCommands(text string) [][]string {
	var out [][]string
	var line string
	for _, l := range strings.Split(text, "\n") {
		if strings.HasSuffix(l, "\\") {
			line += strings.TrimSuffix(l, "\\") + " "
			continue
		}
		line += l
		for _, words := range shellWords(strings.TrimPrefix(strings.TrimSpace(line), "$ ")) {
			for i, w := range words {
				if flashgateBinary[w] {
					out = append(out, words[i+1:])
					break
				}
			}
		}
		line = ""
	}
	return out
}

// checkCommandLine walks flashgate's real command tree along args: every
// command must exist and every flag must be one of that command's.
func checkCommandLine(args []string) error {
	cmd := newRootCmd(env{lookupEnv: func(string) (string, bool) { return "", false }})
	var positional []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if strings.HasPrefix(a, "-") && a != "-" && a != "--" {
			cmd.InitDefaultHelpFlag()
			name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
			var f *pflag.Flag
			if strings.HasPrefix(a, "--") {
				f = lookupFlag(cmd, name)
			} else if len(name) == 1 {
				f = cmd.Flags().ShorthandLookup(name)
				if f == nil {
					f = cmd.InheritedFlags().ShorthandLookup(name)
				}
			}
			if f == nil {
				return fmt.Errorf("%q has no flag %s", cmd.CommandPath(), a)
			}
			if !hasValue && f.NoOptDefVal == "" {
				i++ // the flag's value
			}
			continue
		}
		if len(positional) == 0 {
			if sub := findSub(cmd, a); sub != nil {
				cmd = sub
				continue
			}
		}
		positional = append(positional, a)
	}
	if len(positional) > 0 && cmd.HasSubCommands() {
		return fmt.Errorf("%q has no command %q", cmd.CommandPath(), positional[0])
	}
	if err := cmd.ValidateArgs(positional); err != nil {
		return fmt.Errorf("%q: %w", cmd.CommandPath(), err)
	}
	return nil
}

func lookupFlag(cmd *cobra.Command, name string) *pflag.Flag {
	if f := cmd.Flags().Lookup(name); f != nil {
		return f
	}
	return cmd.InheritedFlags().Lookup(name)
}

func findSub(cmd *cobra.Command, name string) *cobra.Command {
	for _, c := range cmd.Commands() {
		if c.Name() == name || c.HasAlias(name) {
			return c
		}
	}
	return nil
}

// TestDocsShellCommands: every flashgate command line in a shell block of
// the README and the docs names a command that exists and only flags that
// command has; every `make` target exists in the Makefile; every `go install`
// names a package of this module.
func TestDocsShellCommands(t *testing.T) {
	makefile, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	gomod, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	module := regexp.MustCompile(`(?m)^module (\S+)`).FindSubmatch(gomod)[1]
	checked := map[string]int{}
	for _, f := range docFiles(t) {
		for _, b := range fencedBlocks(t, f) {
			if !shellLangs[b.lang] {
				continue
			}
			for _, args := range shellCommands(b.text) {
				checked[strings.TrimPrefix(f, "../../")]++
				if err := checkCommandLine(args); err != nil {
					t.Errorf("%s: flashgate %s: %v", b.where(), strings.Join(args, " "), err)
				}
			}
			for _, words := range shellWordsOf(b.text) {
				switch {
				case len(words) >= 2 && words[0] == "make":
					for _, target := range words[1:] {
						if strings.Contains(target, "=") {
							continue
						}
						if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(target) + `:`).Match(makefile) {
							t.Errorf("%s: make %s: the Makefile has no such target", b.where(), target)
						}
					}
				case len(words) >= 3 && words[0] == "go" && words[1] == "install":
					pkg, _, _ := strings.Cut(words[2], "@")
					dir, ok := strings.CutPrefix(pkg, string(module)+"/")
					if _, err := os.Stat(filepath.Join("../..", dir)); !ok || err != nil {
						t.Errorf("%s: go install %s: not a package of module %s", b.where(), pkg, module)
					}
				}
			}
		}
	}
	t.Logf("flashgate command lines checked per file: %v", checked)
	if checked["README.md"] < 4 || checked["docs/configuration.md"] < 3 || checked["docs/operations.md"] < 5 {
		t.Errorf("too few command lines found (%v): the block parser lost them", checked)
	}
}

// shellWordsOf returns every command of a shell block as words.
func shellWordsOf(text string) [][]string {
	var out [][]string
	for _, l := range strings.Split(text, "\n") {
		out = append(out, shellWords(strings.TrimPrefix(strings.TrimSpace(l), "$ "))...)
	}
	return out
}

func TestCheckCommandLine(t *testing.T) {
	for _, ok := range []string{
		"serve",
		"serve --backend redis --redis-addr 127.0.0.1:6379 --shadow",
		"serve --redis-autopipeline=false --config rules.yaml",
		"check --addr 127.0.0.1:9191 --path /x -H 'x-uid: a' -n 7 --json",
		"bans lift --rule per_ip --value 10.0.0.1 --reset-window",
		"bans list --help",
		"validate --config a.yaml --rls-config dir",
	} {
		for _, args := range shellCommands("flashgate " + ok) {
			if err := checkCommandLine(args); err != nil {
				t.Errorf("flashgate %s: %v", ok, err)
			}
		}
	}
	for _, bad := range []string{
		"serve --no-such-flag",
		"serve --for 1m",                 // bans add's flag
		"bench --addr x",                 // not a command of this binary
		"bans ban --rule r",              // not a subcommand of bans
		"check -Z",                       // no such shorthand
		"version extra",                  // version takes no argument
		"inspect --rule r --value v --x", // unknown after known ones
	} {
		cmds := shellCommands("flashgate " + bad)
		if len(cmds) != 1 {
			t.Fatalf("shellCommands(%q) = %v", bad, cmds)
		}
		if err := checkCommandLine(cmds[0]); err == nil {
			t.Errorf("flashgate %s: accepted", bad)
		}
	}
	got := shellCommands("go run ./cmd/flashgate check --path '/a b' \\\n  -n 2   # a comment --bogus\n$ flashgate version | head\n")
	want := [][]string{{"check", "--path", "/a b", "-n", "2"}, {"version"}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("shellCommands = %q, want %q", got, want)
	}
}

// TestDocsConfigurationListsEveryFlag: docs/configuration.md names every
// flag of serve and of check, so the reference cannot fall behind the code.
func TestDocsConfigurationListsEveryFlag(t *testing.T) {
	data, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	e := env{lookupEnv: func(string) (string, bool) { return "", false }}
	for _, cmd := range []*cobra.Command{newServeCmd(e), newCheckCmd(e)} {
		cmd.Flags().VisitAll(func(f *pflag.Flag) {
			if !strings.Contains(doc, "`--"+f.Name+"`") && !strings.Contains(doc, "`--"+f.Name+" ") {
				t.Errorf("docs/configuration.md does not document %s --%s", cmd.Name(), f.Name)
			}
		})
	}
}
