package descriptors

import (
	"crypto/sha256"
	_ "embed"

	"github.com/flashgate/flashgate/internal/configfile"
)

//go:embed flashsale.yaml
var exampleYAML []byte

// ExampleName is the file name under which the built-in example is reported
// in errors and logs.
const ExampleName = "built-in:flashsale.yaml"

// ExampleYAML returns a copy of the built-in example descriptors file
// (domain "flashsale"), byte for byte the shipped descriptors/flashsale.yaml.
func ExampleYAML() []byte { return append([]byte(nil), exampleYAML...) }

// ExampleConfig parses the built-in example. It fails only if the embedded
// file is broken, which a test rules out.
func ExampleConfig() (*Config, error) { return ParseConfig(ExampleName, exampleYAML) }

// LoadFile reads, parses, defaults and validates the descriptors file at
// path. Errors about the content are a *ConfigError, or ConfigErrors when
// there are several.
func LoadFile(path string) (*Config, error) {
	data, err := ReadFile(path)
	if err != nil {
		return nil, err
	}
	c, err := ParseConfig(path, data)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// ReadFile reads at most MaxFileSize+1 bytes of the descriptors file at
// path, enough for ParseConfig to tell a file that is too large.
func ReadFile(path string) ([]byte, error) {
	return configfile.Read(path, MaxFileSize, "descriptors file")
}

// MaxErrors is the most errors ParseConfig lists for one file; the others
// are counted.
const MaxErrors = configfile.MaxErrors

// ConfigErrors is every error found in one descriptors file, in file order:
// the first MaxErrors listed, and how many more; ParseConfig returns it when
// there is more than one. Error returns them one "FILE:LINE:COL: message" a
// line, then "and N more", and Unwrap each listed *ConfigError, for
// errors.As.
type ConfigErrors = configfile.Errors

// ParseConfig parses, defaults and validates a descriptors file; name is
// used in error positions. Every error about the content is a *ConfigError
// ("name:line:col: sentence"): the one found, or ConfigErrors when there are
// several. A file larger than MaxFileSize, or beyond yamlguard's bounds on
// nesting and tokens, is refused before it is parsed.
func ParseConfig(name string, data []byte) (*Config, error) {
	y := strictYAML{file: name, errs: &errorList{}}
	if len(data) > MaxFileSize {
		return nil, y.errAt(1, 1, "the file is larger than %d bytes", MaxFileSize)
	}
	body, err := y.document(data)
	if err != nil {
		return nil, err
	}
	if body == nil {
		return nil, y.errAt(1, 1, "the file is empty: it needs at least domain and descriptors")
	}
	c, err := compile(y, body)
	if err != nil {
		y.errs.add(err)
	}
	if err := y.errs.result(); err != nil {
		return nil, err
	}
	c.sum = sha256.Sum256(data)
	return c, nil
}
