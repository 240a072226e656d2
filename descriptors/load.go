package descriptors

import (
	"crypto/sha256"
	_ "embed"

	"github.com/flashgate/flashgate/internal/configfile"
)

//go:embed flashsale.yaml
var exampleYAML []byte

// ExampleName names the built-in example in errors and logs.
const ExampleName = "built-in:flashsale.yaml"

// ExampleYAML returns a copy of the built-in example, descriptors/flashsale.yaml.
func ExampleYAML() []byte { return append([]byte(nil), exampleYAML...) }

// ExampleConfig parses the built-in example.
func ExampleConfig() (*Config, error) { return ParseConfig(ExampleName, exampleYAML) }

// LoadFile reads and parses the descriptors file at path.
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

// ReadFile reads at most MaxFileSize+1 bytes of path, so ParseConfig can
// tell a file that is too large.
func ReadFile(path string) ([]byte, error) {
	return configfile.Read(path, MaxFileSize, "descriptors file")
}

// MaxErrors is the most errors ParseConfig lists for one file.
const MaxErrors = configfile.MaxErrors

// ConfigErrors is every error of one file in file order, the first
// MaxErrors listed; Unwrap gives each *ConfigError.
type ConfigErrors = configfile.Errors

// ParseConfig parses, defaults and validates a descriptors file named
// name. Content errors are a *ConfigError, or ConfigErrors when several; a
// file beyond MaxFileSize or yamlguard's bounds is refused unparsed.
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
